// Package vknode runs this host as a virtual-kubelet node: it registers
// the node, keeps its lease and status following sandboxd, runs
// virtual-kubelet's pod controller over the provider, and serves the
// kubelet API that `kubectl logs` reaches.
package vknode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Node labels and taint.
const (
	// LabelHost carries the host's name on its node, for selectors.
	LabelHost = "skiff.dev/host"
	// TaintKey and TaintValue make the NoSchedule taint that keeps every
	// pod off the node but those that tolerate it: the ones meant to be
	// sandboxes.
	TaintKey   = "virtual-kubelet.io/provider"
	TaintValue = "skiff"
)

// Ready condition reasons.
const (
	reasonReady       = "SandboxdReady"
	reasonUnreachable = "SandboxdUnreachable"
)

// Health is sandboxd as its mirror hears it (shared/hostinventory's Host).
type Health interface {
	// Synced reports whether the mirror follows a live Watch stream, and
	// if not why.
	Synced() (bool, error)
	// Inventory is the host's inventory (its capacity), while in sync.
	Inventory() (*v1beta1.NodeInventory, error)
}

// Spec is what the node says of itself.
type Spec struct {
	Name string
	// HostIP is the node's InternalIP.
	HostIP string
	// KubeletPort is the port of the kubelet API (0: not served).
	KubeletPort int32
}

// Version is vk-sandbox's version, as the node's kubeletVersion.
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return "vk-sandbox/" + bi.Main.Version
	}
	return "vk-sandbox/devel"
}

// newNode is the node as first registered: NotReady until sandboxd is
// heard.
func newNode(s Spec) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name,
			Labels: map[string]string{
				"type":                   "virtual-kubelet",
				"kubernetes.io/role":     "agent",
				"kubernetes.io/hostname": s.Name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     runtime.GOARCH,
				LabelHost:                s.Name,
			},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: TaintKey, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Phase:           corev1.NodeRunning,
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: s.HostIP}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: s.KubeletPort}},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux", Architecture: runtime.GOARCH, KubeletVersion: Version(),
			},
		},
	}
	setNodeStatus(n, false, errors.New("not heard yet"), nil, time.Now())
	return n
}

// SharedCPUPerSlot is the CPU (millicores) the node advertises per sandbox
// slot when its host does not admit CPU: e2b's largest sandbox, 8 vCPU, so
// that kube-scheduler never refuses a pod for CPU that sandboxd would take,
// and slots and memory bind as they do in sandboxd.
const SharedCPUPerSlot = 8000

// setNodeStatus sets the Ready condition (and capacity, when known) of n.
// A condition keeps its transition time while its status holds.
func setNodeStatus(n *corev1.Node, ready bool, cause error, inv *v1beta1.NodeInventory, now time.Time) {
	status, reason, msg := corev1.ConditionTrue, reasonReady, "sandboxd is reachable and its Watch stream is live"
	if !ready {
		status, reason, msg = corev1.ConditionFalse, reasonUnreachable, "sandboxd cannot be heard"
		if cause != nil {
			msg += ": " + cause.Error()
		}
	}
	conds := []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: status, Reason: reason, Message: msg},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "SandboxdLimits", Message: "sandboxd refuses sandboxes beyond its capacity"},
		diskCondition(n, inv),
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "SandboxdLimits", Message: "each sandbox has its own pids limit"},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "SandboxdNetwork", Message: "sandboxd gives each sandbox its network"},
	}
	for i := range conds {
		conds[i].LastTransitionTime = metav1.NewTime(now)
		conds[i].LastHeartbeatTime = metav1.NewTime(now)
		for _, old := range n.Status.Conditions {
			if old.Type == conds[i].Type && old.Status == conds[i].Status {
				conds[i].LastTransitionTime = old.LastTransitionTime
				conds[i].LastHeartbeatTime = old.LastHeartbeatTime
			}
		}
	}
	n.Status.Conditions = conds
	if inv != nil {
		c := inv.Spec.Capacity
		cpu := c.CPUMilli
		if inv.Spec.CPUAdmission == v1beta1.CPUShared {
			cpu = int64(c.Sandboxes) * SharedCPUPerSlot
		}
		list := corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(cpu, resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(c.MemoryMiB<<20, resource.BinarySI),
			corev1.ResourcePods:   *resource.NewQuantity(int64(c.Sandboxes), resource.DecimalSI),
		}
		n.Status.Capacity, n.Status.Allocatable = list, list.DeepCopy()
	}
}

// diskCondition is the node's DiskPressure condition: True while the
// host's inventory says the filesystem of its sandboxes and snapshots is
// below sandboxd's --disk-reserve (sandboxd then refuses creates); without
// an inventory (sandboxd not heard), the one n has. A full volume store
// alone does not make it True: sandboxes still start there, and the
// condition's taint (node.kubernetes.io/disk-pressure) would stop every
// pod; its message says so.
func diskCondition(n *corev1.Node, inv *v1beta1.NodeInventory) corev1.NodeCondition {
	if inv == nil {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeDiskPressure {
				return corev1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
			}
		}
	}
	c := corev1.NodeCondition{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "SandboxdLimits",
		Message: "sandboxd refuses sandboxes beyond its capacity, and below its disk reserve"}
	if inv == nil {
		return c
	}
	if inv.Spec.DiskPressure {
		c.Status, c.Reason = corev1.ConditionTrue, "BelowDiskReserve"
		c.Message = "the free space of the host's sandboxes' and snapshots' filesystem is below sandboxd's --disk-reserve: it refuses new sandboxes, snapshots and pauses to disk"
	}
	if inv.Spec.VolumeDiskPressure {
		c.Message += "; its volume store is below the reserve too: it refuses new volumes"
	}
	return c
}

// nodeReady reports the Ready condition of n.
func nodeReady(n *corev1.Node) (corev1.ConditionStatus, string) {
	if n == nil {
		return corev1.ConditionUnknown, ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status, c.Reason
		}
	}
	return corev1.ConditionUnknown, ""
}

// nodeProvider is virtual-kubelet's NodeProvider: readiness follows
// sandboxd. While sandboxd cannot be heard the node reports Ready=False
// and then Ping fails, which stops virtual-kubelet renewing the lease (and
// writing status) until sandboxd is back. Ping fails only once the
// NotReady status is in the API (or after pingGrace), because
// virtual-kubelet writes no status while Ping fails.
type nodeProvider struct {
	health    Health
	observed  func() (*corev1.Node, error) // the node in the informer cache
	pingGrace time.Duration
	log       *slog.Logger
	now       func() time.Time

	mu         sync.Mutex
	node       *corev1.Node // the status last notified
	notify     func(*corev1.Node)
	downSince  time.Time // zero while sandboxd is heard
	notifyWant chan struct{}
}

func newNodeProvider(health Health, observed func() (*corev1.Node, error), node *corev1.Node, pingGrace time.Duration, log *slog.Logger) *nodeProvider {
	return &nodeProvider{health: health, observed: observed, node: node, pingGrace: pingGrace, log: log, now: time.Now,
		downSince: time.Now(), notifyWant: make(chan struct{}, 1)}
}

// initial sets base, the node the node controller registers, from
// sandboxd as heard now.
func (p *nodeProvider) initial(base *corev1.Node) {
	ok, cause := p.health.Synced()
	var inv *v1beta1.NodeInventory
	if ok {
		inv, _ = p.health.Inventory()
	}
	if n, err := p.observed(); err == nil && n != nil {
		// Registered before: keep the transition times of conditions that
		// hold (a restart of vk-sandbox is no transition).
		base.Status.Conditions = n.Status.Conditions
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	setNodeStatus(base, ok, cause, inv, p.now())
	p.node = base.DeepCopy()
	if ok {
		p.downSince = time.Time{}
	}
}

// Ping reports the node alive while sandboxd is heard, and for a grace
// after it stops being heard until the API shows the node NotReady.
func (p *nodeProvider) Ping(context.Context) error {
	ok, cause := p.health.Synced()
	if ok {
		return nil
	}
	p.mu.Lock()
	since := p.downSince
	p.mu.Unlock()
	if since.IsZero() || p.now().Sub(since) < p.pingGrace {
		if n, err := p.observed(); err != nil || n == nil {
			return nil
		} else if st, reason := nodeReady(n); st == corev1.ConditionTrue || reason != reasonUnreachable {
			return nil // let the NotReady status through first
		}
	}
	return fmt.Errorf("sandboxd cannot be heard: %w", cause)
}

// current is the node as last notified.
func (p *nodeProvider) current() *corev1.Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.node.DeepCopy()
}

// NotifyNodeStatus registers virtual-kubelet's callback.
func (p *nodeProvider) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	p.mu.Lock()
	p.notify = cb
	p.mu.Unlock()
	select {
	case p.notifyWant <- struct{}{}:
	default:
	}
}

// run keeps the node's status following sandboxd until ctx ends: on every
// change of the mirror, and every second while the API shows another
// Ready status than the one wanted (virtual-kubelet drops a status update
// made while Ping fails; sandboxd coming back is such a moment).
func (p *nodeProvider) run(ctx context.Context, changes <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
		case <-p.notifyWant:
		case <-t.C:
		}
		p.update(ctx)
	}
}

// update computes the wanted status and notifies it when it changed or
// the API does not show it yet.
func (p *nodeProvider) update(ctx context.Context) {
	ok, cause := p.health.Synced()
	var inv *v1beta1.NodeInventory
	if ok {
		inv, _ = p.health.Inventory()
	}
	now := p.now()
	p.mu.Lock()
	want := p.node.DeepCopy()
	setNodeStatus(want, ok, cause, inv, now)
	switch {
	case ok && !p.downSince.IsZero():
		p.log.Info("sandboxd is heard: the node is Ready")
		p.downSince = time.Time{}
	case !ok && p.downSince.IsZero():
		p.log.Warn("sandboxd cannot be heard: the node goes NotReady and its lease stops", "error", cause)
		p.downSince = now
	}
	changed := !equality.Semantic.DeepEqual(want.Status, p.node.Status)
	p.node = want
	notify := p.notify
	p.mu.Unlock()
	if notify == nil {
		return
	}
	wantReady, _ := nodeReady(want)
	if !changed {
		if n, err := p.observed(); err == nil && n != nil {
			if st, _ := nodeReady(n); st == wantReady {
				return
			}
		}
	}
	// virtual-kubelet's callback blocks until its control loop takes the
	// status; that loop ends with ctx, so wait for it or for ctx. (At
	// shutdown the one goroutine blocked in it ends with the process.)
	sent := make(chan struct{})
	go func() {
		notify(want.DeepCopy())
		close(sent)
	}()
	select {
	case <-sent:
	case <-ctx.Done():
	}
}
