// Package provider is vk-sandbox's virtual-kubelet provider: the pods
// scheduled to this node become sandboxes on its sandboxd, and their
// status follows those sandboxes.
//
// A pod's sandbox carries metadata skiff.dev/pod-uid (the link) and
// skiff.dev/pod (its name), and its team is the pod's namespace. Sandboxes
// without the link (made through the e2b API) are never touched. The link
// lives in sandboxd, so after a restart of vk-sandbox (or of sandboxd,
// which re-adopts its sandboxes) the pods are found again and nothing is
// created or deleted twice.
//
// Status is pushed (virtual-kubelet's PodNotifier), never polled: every
// change on sandboxd's Watch stream is compared with each pod's last
// status. Reads of pods come from the pod informer's cache.
package provider

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Sandboxd is the part of sandboxd's API the provider calls.
type Sandboxd interface {
	Create(context.Context, *connect.Request[pb.CreateRequest]) (*connect.Response[pb.CreateResponse], error)
	Kill(context.Context, *connect.Request[pb.KillRequest]) (*connect.Response[pb.KillResponse], error)
	SetTimeout(context.Context, *connect.Request[pb.SetTimeoutRequest]) (*connect.Response[pb.SetTimeoutResponse], error)
	Logs(context.Context, *connect.Request[pb.LogsRequest]) (*connect.Response[pb.LogsResponse], error)
}

// Mirror is sandboxd's sandboxes as last heard on its Watch stream
// (shared/hostinventory's Host); it fails while it cannot vouch for them.
type Mirror interface {
	Sandboxes() ([]*pb.Sandbox, error)
}

// Ender is an optional capability of a Mirror: why a sandbox that left it
// ended, when it ended by itself (its envd died: OOM-killed, crashed), as
// sandboxd's Watch said; "" when it did not say.
type Ender interface {
	Ended(sandboxID string) string
}

// Config wires a Provider.
type Config struct {
	Sandboxd Sandboxd
	Mirror   Mirror
	// Pods lists this node's pods from the pod informer's cache.
	Pods corev1listers.PodLister
	// Node returns this node from the node informer's cache.
	Node func() (*corev1.Node, error)
	// Config reads the ConfigMaps and Secrets pods' environments name.
	Config ConfigGetter
	// HostIP is the node's address, each pod's hostIP.
	HostIP string
	// DefaultTimeout is a sandbox's lifetime when its pod sets neither
	// activeDeadlineSeconds nor the timeout annotation.
	DefaultTimeout time.Duration
	Log            *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// notSeenGrace is how long a sandbox that Create returned may stay out of
// the mirror before its pod counts it as ended: the Watch stream reports a
// new sandbox within milliseconds.
const notSeenGrace = 30 * time.Second

// deadlineSlack: a sandbox that ends this close to its deadline ended by
// it (sandboxd's deadline timer fires at endAt).
const deadlineSlack = 2 * time.Second

// Provider implements virtual-kubelet's PodLifecycleHandler and
// PodNotifier over sandboxd.
type Provider struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	wg sync.WaitGroup // creates retried by sync

	mu       sync.Mutex
	pods     map[types.UID]*podState
	notifyFn func(*corev1.Pod)
	resync   chan struct{}
	orphans  map[string]bool // sandboxes linked to no known pod, as logged
}

// podState is what the provider knows of one pod.
type podState struct {
	op sync.Mutex // serialises Create, Update and Delete of this pod

	uid             types.UID
	namespace, name string
	pod             *corev1.Pod // the last pod virtual-kubelet gave
	sandbox         *pb.Sandbox // the last seen; nil before one exists
	seen            bool        // seen in the mirror (not only in Create's answer)
	createdAt       time.Time
	end             *ending
	killed          bool // DeletePod killed it
	released        bool // evicted for the node's health: left running, detached
	notified        *corev1.PodStatus
	retry           bool // create again at retryAt (after a transient failure)
	retryAt         time.Time
	attempts        int
}

// New returns a provider; Run keeps its pods' status current.
func New(cfg Config) *Provider {
	p := &Provider{cfg: cfg, log: cfg.Log, now: cfg.Now, pods: map[types.UID]*podState{},
		resync: make(chan struct{}, 1), orphans: map[string]bool{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p
}

// NotifyPods registers virtual-kubelet's callback for status changes.
func (p *Provider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	p.mu.Lock()
	p.notifyFn = cb
	p.mu.Unlock()
	p.kick()
}

// kick asks Run for a pass.
func (p *Provider) kick() {
	select {
	case p.resync <- struct{}{}:
	default:
	}
}

// Run syncs pods with sandboxd after every change of the mirror until ctx
// ends. changes receives after each change (a hostwatch subscription).
func (p *Provider) Run(ctx context.Context, changes <-chan struct{}) {
	// A tick for what no event announces: creates to retry, a sandbox
	// Create returned that never reached the mirror.
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	defer p.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
		case <-p.resync:
		case <-tick.C:
		}
		p.sync(ctx)
	}
}

// linkOf is the pod UID a sandbox is linked to, or "".
func linkOf(sb *pb.Sandbox) types.UID {
	if sb.GetTeam() == "" {
		return ""
	}
	return types.UID(sb.GetMetadata()[MetaPodUID])
}

// state returns pod's state, making it.
func (p *Provider) state(pod *corev1.Pod) *podState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked(pod)
}

func (p *Provider) stateLocked(pod *corev1.Pod) *podState {
	st := p.pods[pod.UID]
	if st == nil {
		st = &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, pod: pod.DeepCopy()}
		p.pods[pod.UID] = st
	}
	return st
}

// sync compares every pod with the mirror: sandboxes that came, changed or
// went, pods that ran before vk-sandbox started and whose sandbox is gone,
// sandboxes whose pod is terminal. It notifies virtual-kubelet of every
// status that changed. While the mirror is out of sync it does nothing:
// a sandboxd that cannot be heard ends no pod.
func (p *Provider) sync(ctx context.Context) {
	sbs, err := p.cfg.Mirror.Sandboxes()
	if err != nil {
		return
	}
	linked := make(map[types.UID]*pb.Sandbox)
	for _, sb := range sbs {
		if uid := linkOf(sb); uid != "" {
			linked[uid] = sb
		}
	}
	pods, err := p.cfg.Pods.List(labels.Everything())
	if err != nil {
		p.log.Error("list pods from the informer cache", "error", err)
		return
	}
	byUID := make(map[types.UID]*corev1.Pod, len(pods))
	for _, pod := range pods {
		byUID[pod.UID] = pod
	}
	now := p.now()

	p.mu.Lock()
	kills := p.adoptLocked(linked, byUID)
	p.endLocked(linked, byUID, now)
	notes, retries := p.pushLocked(linked, byUID, now)
	notify := p.notifyFn
	p.mu.Unlock()

	for _, pod := range retries {
		p.wg.Go(func() { _ = p.CreatePod(ctx, pod) })
	}
	for _, id := range kills {
		_ = p.kill(ctx, id, "its pod is terminal") // logged; the next sync tries again
	}
	for _, pod := range notes {
		notify(pod)
	}
}

// adoptLocked takes the mirror's linked sandboxes: a pod's state follows
// its sandbox (made for a pod that ran before vk-sandbox started), a
// sandbox linked to no pod is an orphan (logged once, never killed), and
// the sandboxes of terminal pods are returned, to kill.
func (p *Provider) adoptLocked(linked map[types.UID]*pb.Sandbox, byUID map[types.UID]*corev1.Pod) (kills []string) {
	orphans := map[string]bool{}
	for uid, sb := range linked {
		st, pod := p.pods[uid], byUID[uid]
		if st == nil && pod == nil {
			orphans[sb.GetId()] = true
			if !p.orphans[sb.GetId()] {
				p.log.Warn("a sandbox is linked to a pod that no longer exists: left to run to its deadline", "sandbox", sb.GetId())
			}
			continue
		}
		if st == nil {
			st = p.stateLocked(pod)
		}
		st.sandbox, st.seen = sb, true
		if !st.released && pod != nil && terminal(pod.Status.Phase) && st.end == nil {
			// A terminal pod never has a running sandbox.
			kills = append(kills, sb.GetId())
		}
	}
	p.orphans = orphans
	p.cfg.Metrics.orphans(len(orphans))
	return kills
}

// endLocked ends the pods whose sandbox left the mirror, and the pods that
// had a sandbox before vk-sandbox started and have none now.
func (p *Provider) endLocked(linked map[types.UID]*pb.Sandbox, byUID map[types.UID]*corev1.Pod, now time.Time) {
	for uid, st := range p.pods {
		if linked[uid] != nil || st.end != nil || st.released || st.sandbox == nil {
			continue
		}
		if !st.seen && now.Sub(st.createdAt) < notSeenGrace {
			continue // Create answered; the stream has not shown it yet
		}
		st.end = endingOf(st, now)
		if ender, ok := p.cfg.Mirror.(Ender); ok && !st.killed {
			if why := ender.Ended(st.sandbox.GetId()); why != "" {
				st.end = &ending{phase: corev1.PodFailed, reason: ReasonSandboxDied, message: why, exitCode: 137, at: now}
			}
		}
		p.log.Info("the sandbox of a pod ended", "pod", st.namespace+"/"+st.name, "sandbox", st.sandbox.GetId(), "reason", st.end.reason, "message", st.end.message)
		p.cfg.Metrics.ended(st.end.reason)
	}
	for uid, pod := range byUID {
		if p.pods[uid] != nil || linked[uid] != nil || terminal(pod.Status.Phase) {
			continue
		}
		if id := sandboxID(pod); id != "" {
			st := p.stateLocked(pod)
			st.end = endedUnseen(pod, now, p.cfg.DefaultTimeout)
			p.log.Info("the sandbox of a pod ended while vk-sandbox was away", "pod", pod.Namespace+"/"+pod.Name, "sandbox", id, "reason", st.end.reason)
			p.cfg.Metrics.ended(st.end.reason)
		}
	}
}

// pushLocked returns the pods whose status changed since last notified,
// with their new status, and the pods whose create is due again; it
// forgets the pods gone from both Kubernetes and sandboxd.
func (p *Provider) pushLocked(linked map[types.UID]*pb.Sandbox, byUID map[types.UID]*corev1.Pod, now time.Time) (notes, retries []*corev1.Pod) {
	for uid, st := range p.pods {
		pod := byUID[uid]
		if pod == nil {
			if linked[uid] == nil {
				delete(p.pods, uid)
			}
			continue
		}
		if st.retry && !now.Before(st.retryAt) && pod.DeletionTimestamp == nil {
			st.retry = false
			retries = append(retries, pod)
		}
		if st.released || p.notifyFn == nil || (st.sandbox == nil && st.end == nil) {
			continue
		}
		status := podStatus(pod, st.sandbox, st.end, p.cfg.HostIP)
		if st.notified != nil && equality.Semantic.DeepEqual(*st.notified, status) {
			continue
		}
		st.notified = &status
		out := pod.DeepCopy()
		out.Status = status
		notes = append(notes, out)
	}
	return notes, retries
}

// endingOf is how a sandbox that left the mirror ended.
func endingOf(st *podState, now time.Time) *ending {
	if st.killed {
		return &ending{phase: corev1.PodFailed, reason: ReasonKilled, message: "the pod was deleted: its sandbox was killed", exitCode: 137, at: now}
	}
	if end := st.sandbox.GetEndAt(); end != nil && !now.Before(end.AsTime().Add(-deadlineSlack)) {
		return deadlineEnding(st.pod, end.AsTime())
	}
	return &ending{phase: corev1.PodFailed, reason: ReasonSandboxKilled,
		message: "the sandbox was killed outside Kubernetes (the e2b API or sandboxd) before its deadline", exitCode: 137, at: now}
}

// deadlineEnding is a sandbox that reached its deadline at: with
// activeDeadlineSeconds that is a failure, as for the kubelet; with a
// timeout it is the sandbox's natural end.
func deadlineEnding(pod *corev1.Pod, at time.Time) *ending {
	if pod != nil && pod.Spec.ActiveDeadlineSeconds != nil {
		return &ending{phase: corev1.PodFailed, reason: ReasonDeadlineExceeded,
			message: "the sandbox reached the pod's activeDeadlineSeconds", exitCode: 137, at: at}
	}
	return &ending{phase: corev1.PodSucceeded, reason: ReasonCompleted, message: "the sandbox lived out its timeout", at: at}
}

// endedUnseen is how the sandbox of a pod that had one ended while
// vk-sandbox was not watching: by its deadline if that has passed.
func endedUnseen(pod *corev1.Pod, now time.Time, def time.Duration) *ending {
	if timeout, err := timeoutOf(pod, def); err == nil && pod.Status.StartTime != nil {
		if end := pod.Status.StartTime.Add(timeout); !now.Before(end.Add(-deadlineSlack)) {
			return deadlineEnding(pod, end)
		}
	}
	return &ending{phase: corev1.PodFailed, reason: ReasonSandboxLost,
		message: "the sandbox ended before its deadline while vk-sandbox was not watching (killed, or the host restarted)", exitCode: 137, at: now}
}

// GetPod returns a pod with its sandbox's status, or a NotFound: a pod
// that has no sandbox (yet), or whose sandbox was released.
func (p *Provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	pod, err := p.cfg.Pods.Pods(namespace).Get(name)
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return nil, fmt.Errorf("get pod %s/%s from the cache: %w", namespace, name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var st *podState
	if pod != nil {
		st = p.pods[pod.UID]
	} else {
		// Deleted from the API: the state of the last pod of that name.
		for _, s := range p.pods {
			if s.namespace == namespace && s.name == name && (st == nil || s.createdAt.After(st.createdAt)) {
				st = s
			}
		}
		if st != nil {
			pod = st.pod
		}
	}
	if st == nil || st.released || (st.sandbox == nil && st.end == nil) {
		return nil, errdefs.NotFoundf("pod %s/%s has no sandbox on this node", namespace, name)
	}
	out := pod.DeepCopy()
	out.Status = podStatus(pod, st.sandbox, st.end, p.cfg.HostIP)
	return out, nil
}

// GetPodStatus returns the status GetPod would.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns the pods that have a sandbox on this node and exist in
// Kubernetes. A sandbox whose pod is gone is not a pod: virtual-kubelet's
// start-up sweep (deleteDanglingPods) deletes the provider pods it does not
// find in its cache, and a sandbox left running on purpose (released on an
// eviction for the node's health) must survive a restart of vk-sandbox.
func (p *Provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	pods, err := p.cfg.Pods.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list pods from the cache: %w", err)
	}
	var out []*corev1.Pod
	for _, pod := range pods {
		if got, err := p.GetPod(ctx, pod.Namespace, pod.Name); err == nil && got.UID == pod.UID {
			out = append(out, got)
		}
	}
	return out, nil
}
