package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/vknode"
)

const ns = "team-a"

// The whole life of a host under vk-sandbox, in order: registration, the
// inventory, pods becoming sandboxes and ending, restarts of vk-sandbox,
// an eviction for the node's health, and sandboxd dying and coming back.
func TestVKSandbox(t *testing.T) {
	// The first vk-sandbox publishes every hour: every write after its
	// first is a change's.
	s := newSystem(t, "--publish-interval", "1h", "--publish-min-interval", "500ms")
	ctx := t.Context()
	if _, err := s.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager runs: the default service account is ours to make.
	if _, err := s.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	info, err := s.sbd.Info(ctx, connect.NewRequest(&pb.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	// Every write of the inventory, as a watch sees it; a delete fails the test.
	writes := s.watchInventory(t)

	step(t, "the node registers and goes Ready", func(t *testing.T) {
		n := s.waitNodeReady(t, corev1.ConditionTrue)
		if n.Labels["type"] != "virtual-kubelet" || n.Labels["skiff.dev/host"] != s.node {
			t.Errorf("labels: %v", n.Labels)
		}
		wantTaint := corev1.Taint{Key: "virtual-kubelet.io/provider", Value: "skiff", Effect: corev1.TaintEffectNoSchedule}
		if !slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.MatchTaint(&wantTaint) }) {
			t.Errorf("taints: %v", n.Spec.Taints)
		}
		c := n.Status.Capacity
		// sandboxd's default shares its CPU: the node advertises 8 CPUs per
		// slot, so kube-scheduler refuses no pod for CPU.
		if !info.Msg.GetCpuShared() {
			t.Errorf("sandboxd admits CPU by default: %v", info.Msg)
		}
		if cpu := c[corev1.ResourceCPU]; cpu.MilliValue() != int64(info.Msg.GetMaxSandboxes())*vknode.SharedCPUPerSlot {
			t.Errorf("cpu capacity %s, want 8 per slot of sandboxd's %d", cpu.String(), info.Msg.GetMaxSandboxes())
		}
		if mem := c[corev1.ResourceMemory]; mem.Value() != info.Msg.GetCapacity().GetMemoryMib()<<20 {
			t.Errorf("memory capacity %s, sandboxd says %d MiB", mem.String(), info.Msg.GetCapacity().GetMemoryMib())
		}
		if pods := c[corev1.ResourcePods]; pods.Value() != int64(info.Msg.GetMaxSandboxes()) {
			t.Errorf("pods capacity %s, sandboxd says %d", pods.String(), info.Msg.GetMaxSandboxes())
		}
		if !equality.Semantic.DeepEqual(n.Status.Allocatable, n.Status.Capacity) {
			t.Errorf("allocatable %v, capacity %v", n.Status.Allocatable, n.Status.Capacity)
		}
		if len(n.Status.Addresses) != 1 || n.Status.Addresses[0] != (corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}) {
			t.Errorf("addresses: %v", n.Status.Addresses)
		}
		if n.Status.DaemonEndpoints.KubeletEndpoint.Port == 0 {
			t.Error("no kubelet port")
		}
		// The lease is renewed.
		first := s.lease(t).Spec.RenewTime.Time
		eventually(t, 30*time.Second, "the lease to be renewed", func() bool { return s.lease(t).Spec.RenewTime.After(first) })
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := s.adminGet(path); code != 200 {
				t.Errorf("%s: %d %s", path, code, body)
			}
		}
		if _, body := s.adminGet("/metrics"); !strings.Contains(body, "skiff_vk_sandbox_inventory_publishes_total") {
			t.Errorf("/metrics lacks the publisher's metrics:\n%.2000s", body)
		}
	})

	var e2bID string
	step(t, "the inventory appears, and a sandbox made through the e2b API reaches it on a change", func(t *testing.T) {
		first := next(t, writes, 60*time.Second)
		inv := s.inventory(t)
		if inv.Spec.Endpoint != s.sbdAddr || inv.Spec.Capacity.CPUMilli != info.Msg.GetCapacity().GetCpuMilli() ||
			!slices.ContainsFunc(inv.Spec.Templates, func(tv v1beta1.TemplateVersion) bool { return tv.Name == "base" }) {
			t.Errorf("inventory: %+v", inv.Spec)
		}
		drain(writes)
		resp, err := s.sbd.Create(ctx, connect.NewRequest(&pb.CreateRequest{Template: "base", Timeout: durationpb.New(30 * time.Minute),
			Team: "team-e2b", Metadata: map[string]string{"purpose": "e2b"}}))
		if err != nil {
			t.Fatal(err)
		}
		e2bID = resp.Msg.GetSandbox().GetId()
		// With a publish interval of an hour, only a change publishes it.
		w := waitWrite(t, writes, 60*time.Second, func(w stamped) bool { return hasSandbox(w.spec, e2bID) })
		if w.stamp.Before(first.stamp) {
			t.Errorf("the change's stamp %s is older than the first %s", w.stamp, first.stamp)
		}
	})

	var pod1 *corev1.Pod
	var id1 string
	step(t, "a pod with the template annotation and the toleration becomes a sandbox and reaches Running", func(t *testing.T) {
		pod1 = s.createPod(t, "sb-1", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GREETING", Value: "hi"}, {Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
		})
		pod1 = s.waitPod(t, "sb-1", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		id1 = podSandbox(t, pod1)
		sb := s.getSandbox(t, id1)
		if sb == nil {
			t.Fatalf("no sandbox %s", id1)
		}
		if sb.GetTeam() != ns || sb.GetMetadata()["skiff.dev/pod-uid"] != string(pod1.UID) || sb.GetMetadata()["skiff.dev/pod"] != "sb-1" {
			t.Errorf("sandbox team %q metadata %v", sb.GetTeam(), sb.GetMetadata())
		}
		if sb.GetResources().GetCpuMilli() != 500 || sb.GetResources().GetMemoryMib() != 256 {
			t.Errorf("sandbox resources %v", sb.GetResources())
		}
		if pod1.Status.PodIP == "" || pod1.Status.PodIP != sb.GetAddress() || pod1.Status.HostIP != "127.0.0.1" {
			t.Errorf("podIP %q (sandbox %q), hostIP %q", pod1.Status.PodIP, sb.GetAddress(), pod1.Status.HostIP)
		}
		if !podReady(pod1) || !pod1.Status.ContainerStatuses[0].Ready {
			t.Errorf("not ready: %+v", pod1.Status)
		}
		waitWrite(t, writes, 60*time.Second, func(w stamped) bool { return hasSandbox(w.spec, id1) })
	})

	step(t, "kubectl logs returns the sandbox's log", func(t *testing.T) {
		logs, err := s.sbd.Logs(ctx, connect.NewRequest(&pb.LogsRequest{SandboxId: id1}))
		if err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for _, l := range logs.Msg.GetLogs() {
			want.WriteString(l.GetLine() + "\n")
		}
		out, err := exec.CommandContext(ctx, s.kubectl, "--kubeconfig", s.kc, "-n", ns, "logs", "sb-1").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl logs: %v\n%s", err, out)
		}
		if want.Len() == 0 || !strings.HasPrefix(string(out), want.String()) {
			t.Errorf("kubectl logs gave\n%s\nwant it to start with sandboxd's log\n%s", out, want.String())
		}
		out, err = exec.CommandContext(ctx, s.kubectl, "--kubeconfig", s.kc, "-n", ns, "logs", "sb-1", "--tail", "1", "--timestamps").CombinedOutput()
		if err != nil || strings.Count(string(out), "\n") != 1 || !strings.HasPrefix(string(out), "20") {
			t.Errorf("kubectl logs --tail 1 --timestamps: %v\n%s", err, out)
		}
	})

	step(t, "SIGTERM and a restart of vk-sandbox inside the window change nothing", func(t *testing.T) {
		before := s.inventory(t)
		sandboxesBefore := s.sandboxIDs(t)
		drain(writes)
		s.vk.Stop()
		// Stopped: the inventory stays, unwritten (no final write, no delete).
		time.Sleep(time.Second)
		if cur := s.inventory(t); cur.ResourceVersion != before.ResourceVersion {
			t.Errorf("the inventory was written on shutdown: rv %s -> %s", before.ResourceVersion, cur.ResourceVersion)
		}
		podBefore := s.pod(t, "sb-1")
		// Back with a short interval for the next steps.
		s.vk.Args = mergeFlags(s.vk.Args, []string{"--publish-interval", "2s"})
		s.vk.Start()
		eventually(t, 60*time.Second, "the new vk-sandbox to be ready", func() bool { code, _ := s.adminGet("/readyz"); return code == 200 })
		w := waitWrite(t, writes, 60*time.Second, func(w stamped) bool { return w.rv != before.ResourceVersion })
		// A restarted host writes its shards again (under a new fold
		// number) before its inventory, which names the newer writes.
		if w.spec.ShardsResourceVersion == "" || w.spec.ShardsResourceVersion == before.Spec.ShardsResourceVersion {
			t.Errorf("the restarted host's inventory names shard write %q (before: %q), want a newer one", w.spec.ShardsResourceVersion, before.Spec.ShardsResourceVersion)
		}
		same := w.spec
		same.ShardsResourceVersion = before.Spec.ShardsResourceVersion
		if !equality.Semantic.DeepEqual(same, before.Spec) {
			t.Errorf("the restart changed the inventory:\n%+v\nwas\n%+v", w.spec, before.Spec)
		}
		// Give the pod controller a few seconds to do whatever it does on start.
		time.Sleep(5 * time.Second)
		podAfter := s.pod(t, "sb-1")
		if podAfter.UID != podBefore.UID || podAfter.DeletionTimestamp != nil || podAfter.Status.Phase != corev1.PodRunning ||
			podAfter.Status.PodIP != podBefore.Status.PodIP || podSandbox(t, podAfter) != id1 {
			t.Errorf("the pod changed over the restart:\n%+v\nwas\n%+v", podAfter.Status, podBefore.Status)
		}
		// Not even rewritten: the status vk-sandbox computes again is the one it wrote.
		if podAfter.ResourceVersion != podBefore.ResourceVersion {
			t.Errorf("the pod was rewritten over the restart (rv %s -> %s), status equal: %v", podBefore.ResourceVersion, podAfter.ResourceVersion,
				equality.Semantic.DeepEqual(podAfter.Status, podBefore.Status))
		}
		if after := s.sandboxIDs(t); !slices.Equal(after, sandboxesBefore) {
			t.Errorf("sandboxes %v, before the restart %v", after, sandboxesBefore)
		}
		if n := s.getNode(t); !nodeIs(n, corev1.ConditionTrue) {
			t.Errorf("node not Ready after the restart: %+v", n.Status.Conditions)
		}
	})

	step(t, "the inventory is stamped every interval while nothing changes", func(t *testing.T) {
		drain(writes)
		prev := next(t, writes, 30*time.Second)
		for range 3 {
			w := next(t, writes, 30*time.Second)
			if !equality.Semantic.DeepEqual(w.spec, prev.spec) {
				t.Errorf("the spec changed with nothing changing:\n%+v\n%+v", w.spec, prev.spec)
			}
			if gap := w.stamp.Sub(prev.stamp); gap < time.Second {
				t.Errorf("stamps %s then %s: more often than the 2s interval", prev.stamp, w.stamp)
			}
			prev = w
		}
	})

	step(t, "deleting the pod kills its sandbox", func(t *testing.T) {
		drain(writes)
		if err := s.kube.CoreV1().Pods(ns).Delete(ctx, "sb-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "the sandbox to be killed", func() bool { return s.getSandbox(t, id1) == nil })
		eventually(t, 60*time.Second, "the pod to be gone", func() bool { return s.podGone(t, "sb-1") })
		if s.getSandbox(t, e2bID) == nil {
			t.Error("the e2b sandbox went too")
		}
		waitWrite(t, writes, 60*time.Second, func(w stamped) bool { return !hasSandbox(w.spec, id1) })
	})

	step(t, "a sandbox that ends marks its pod Failed", func(t *testing.T) {
		s.createPod(t, "sb-2", nil)
		p := s.waitPod(t, "sb-2", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		id := podSandbox(t, p)
		// Killed outside Kubernetes, as through the e2b API.
		if _, err := s.sbd.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
		p = s.waitPod(t, "sb-2", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if p.Status.Reason != "SandboxKilled" || p.Status.ContainerStatuses[0].State.Terminated == nil {
			t.Errorf("failed pod: %+v", p.Status)
		}
		// Past its activeDeadlineSeconds.
		s.createPod(t, "sb-3", func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = new(int64(4)) })
		s.waitPod(t, "sb-3", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		p = s.waitPod(t, "sb-3", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if p.Status.Reason != "DeadlineExceeded" {
			t.Errorf("deadline: %+v", p.Status)
		}
		// A template this host does not have: sandboxd refuses, the pod fails.
		s.createPod(t, "sb-x", func(p *corev1.Pod) { p.Annotations["skiff.dev/template"] = "no-such-template" })
		p = s.waitPod(t, "sb-x", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if p.Status.Reason != "SandboxRejected" || !strings.Contains(p.Status.Message, "no-such-template") {
			t.Errorf("rejected: %+v", p.Status)
		}
		// Terminal pods go when deleted.
		for _, name := range []string{"sb-2", "sb-3", "sb-x"} {
			if err := s.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 60*time.Second, name+" to be gone", func() bool { return s.podGone(t, name) })
		}
	})

	var id4 string
	step(t, "an eviction for the node's health leaves the sandbox running", func(t *testing.T) {
		s.createPod(t, "sb-4", nil)
		p := s.waitPod(t, "sb-4", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		id4 = podSandbox(t, p)
		// What the node lifecycle controller and the taint-eviction
		// controller do to a node they cannot hear: taint it, mark the pod,
		// delete it.
		unreachable := corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: new(metav1.Now())}
		s.setTaint(t, unreachable, true)
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: "DeletionByTaintManager", Message: "Taint manager: deleting due to NoExecute taint", LastTransitionTime: metav1.Now()})
		if _, err := s.kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := s.kube.CoreV1().Pods(ns).Delete(ctx, "sb-4", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "the evicted pod to be gone", func() bool { return s.podGone(t, "sb-4") })
		s.setTaint(t, unreachable, false)
		if sb := s.getSandbox(t, id4); sb == nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING {
			t.Fatalf("the evicted pod's sandbox was killed: %v", sb)
		}
		// A restart: virtual-kubelet's start-up sweep must not kill it
		// either (its pod is gone).
		s.vk.Stop()
		s.vk.Start()
		eventually(t, 60*time.Second, "the new vk-sandbox to be ready", func() bool { code, _ := s.adminGet("/readyz"); return code == 200 })
		time.Sleep(3 * time.Second)
		if s.getSandbox(t, id4) == nil {
			t.Fatal("the released sandbox was killed after a restart")
		}
	})

	step(t, "killing sandboxd: the node goes NotReady, no stamps; after its restart everything comes back", func(t *testing.T) {
		s.createPod(t, "sb-5", nil)
		p := s.waitPod(t, "sb-5", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		id5 := podSandbox(t, p)
		s.sandboxd.Kill9()
		drain(writes)
		n := s.waitNodeReady(t, corev1.ConditionFalse)
		if c := readyCondition(n); c.Reason != "SandboxdUnreachable" {
			t.Errorf("NotReady condition: %+v", c)
		}
		// Whatever was under way lands; then nothing more is written.
		time.Sleep(2 * time.Second)
		lease, inv := s.lease(t), s.inventory(t)
		time.Sleep(8 * time.Second) // two lease renewals (1 s) and four publish intervals (2 s) over
		if cur := s.lease(t); !cur.Spec.RenewTime.Equal(lease.Spec.RenewTime) {
			t.Errorf("the lease was renewed while sandboxd was dead: %s -> %s", lease.Spec.RenewTime, cur.Spec.RenewTime)
		}
		if cur := s.inventory(t); cur.ResourceVersion != inv.ResourceVersion {
			t.Errorf("the inventory was written while sandboxd was dead: rv %s -> %s (stamp %s -> %s)",
				inv.ResourceVersion, cur.ResourceVersion, inv.PublishedAt, cur.PublishedAt)
		}
		if p := s.pod(t, "sb-5"); p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			t.Errorf("the pod changed while sandboxd was dead: %+v", p.Status)
		}
		drain(writes)
		s.host.StartSandboxd(t)
		s.waitNodeReady(t, corev1.ConditionTrue)
		eventually(t, 30*time.Second, "the lease to be renewed again", func() bool { return s.lease(t).Spec.RenewTime.After(lease.Spec.RenewTime.Time) })
		w := waitWrite(t, writes, 60*time.Second, func(w stamped) bool { return w.rv != inv.ResourceVersion })
		for _, id := range []string{e2bID, id4, id5} {
			if !hasSandbox(w.spec, id) {
				t.Errorf("sandbox %s is not in the inventory after sandboxd's restart: %+v", id, w.spec.Sandboxes)
			}
		}
		if p := s.pod(t, "sb-5"); p.Status.Phase != corev1.PodRunning || podSandbox(t, p) != id5 {
			t.Errorf("the pod after sandboxd's restart: %+v", p.Status)
		}
	})

	step(t, "the e2b sandbox was never touched", func(t *testing.T) {
		sb := s.getSandbox(t, e2bID)
		if sb == nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING || sb.GetMetadata()["purpose"] != "e2b" {
			t.Errorf("e2b sandbox: %v", sb)
		}
		if _, err := s.kube.CoreV1().Pods("team-e2b").List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	})
}

// step runs one phase; a failed phase ends the test, since the next ones
// build on it.
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, f) {
		t.FailNow()
	}
}

func (s *system) createPod(t *testing.T, name string, mod func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{"skiff.dev/template": "base"}},
		Spec: corev1.PodSpec{
			// As the scheduler would: there is none in this control plane.
			NodeName:                      s.node,
			Containers:                    []corev1.Container{{Name: "sandbox", Image: "skiff/base"}},
			Tolerations:                   []corev1.Toleration{{Key: "virtual-kubelet.io/provider", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: &grace,
			RestartPolicy:                 corev1.RestartPolicyNever,
		},
	}
	if mod != nil {
		mod(p)
	}
	out, err := s.kube.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *system) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := s.kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *system) podGone(t *testing.T, name string) bool {
	_, err := s.kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

func (s *system) waitPod(t *testing.T, name string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	eventually(t, 90*time.Second, "pod "+name, func() bool {
		p = s.pod(t, name)
		return cond(p)
	})
	return p
}

func podSandbox(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	if len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s has container statuses %+v", p.Name, p.Status.ContainerStatuses)
	}
	id, ok := strings.CutPrefix(p.Status.ContainerStatuses[0].ContainerID, "skiff://")
	if !ok || len(id) != 20 {
		t.Fatalf("pod %s has container ID %q", p.Name, p.Status.ContainerStatuses[0].ContainerID)
	}
	return id
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (s *system) getSandbox(t *testing.T, id string) *pb.Sandbox {
	t.Helper()
	resp, err := s.sbd.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetSandbox()
}

func (s *system) sandboxIDs(t *testing.T) []string {
	t.Helper()
	resp, err := s.sbd.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range resp.Msg.GetSandboxes() {
		ids = append(ids, sb.GetId())
	}
	slices.Sort(ids)
	return ids
}

func (s *system) getNode(t *testing.T) *corev1.Node {
	t.Helper()
	n, err := s.kube.CoreV1().Nodes().Get(t.Context(), s.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func readyCondition(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func nodeIs(n *corev1.Node, st corev1.ConditionStatus) bool { return readyCondition(n).Status == st }

func (s *system) waitNodeReady(t *testing.T, st corev1.ConditionStatus) *corev1.Node {
	t.Helper()
	var n *corev1.Node
	eventually(t, 90*time.Second, "node Ready="+string(st), func() bool {
		var err error
		n, err = s.kube.CoreV1().Nodes().Get(t.Context(), s.node, metav1.GetOptions{})
		return err == nil && nodeIs(n, st)
	})
	return n
}

func (s *system) lease(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	var l *coordinationv1.Lease
	eventually(t, 60*time.Second, "the node lease", func() bool {
		var err error
		l, err = s.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), s.node, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil
	})
	return l
}

// setTaint adds or removes a taint on the node, as the node lifecycle
// controller does.
func (s *system) setTaint(t *testing.T, taint corev1.Taint, on bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := s.getNode(t)
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.MatchTaint(&taint) })
		if on {
			n.Spec.Taints = append(n.Spec.Taints, taint)
		}
		_, err := s.kube.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (s *system) inventory(t *testing.T) *v1beta1.NodeInventory {
	t.Helper()
	u, err := s.dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)).Get(t.Context(), s.node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the inventory: %v", err)
	}
	var inv v1beta1.NodeInventory
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &inv); err != nil {
		t.Fatal(err)
	}
	if err := s.join(t.Context(), &inv); err != nil {
		t.Fatal(err)
	}
	return &inv
}

// join reads the shards of a sharded inventory (vk-sandbox's default) into
// its spec.sandboxes, as the readers' freshness filter does.
func (s *system) join(ctx context.Context, inv *v1beta1.NodeInventory) error {
	one := []v1beta1.NodeInventory{*inv}
	if err := kubeinventory.Join(ctx, s.client, one); err != nil {
		return err
	}
	*inv = one[0]
	return nil
}

// stamped is one write of the inventory, with its shards joined.
type stamped struct {
	rv    string
	stamp time.Time
	spec  v1beta1.NodeInventorySpec
}

// watchInventory reports every write of the node's inventory until the
// test ends; a delete fails the test.
func (s *system) watchInventory(t *testing.T) <-chan stamped {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan stamped, 1000)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	res := s.dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource))
	go func() {
		defer close(done)
		rv := ""
		for ctx.Err() == nil {
			w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + s.node, ResourceVersion: rv})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Deleted {
					t.Errorf("the inventory was deleted")
				}
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ev.Object)
				if err != nil {
					continue
				}
				var inv v1beta1.NodeInventory
				if runtime.DefaultUnstructuredConverter.FromUnstructured(u, &inv) != nil || inv.PublishedAt == nil {
					t.Errorf("a write without publishedAt: %v", u)
					continue
				}
				rv = inv.ResourceVersion
				// The host writes changed shards before the inventory, so
				// they are there to be joined now.
				if err := s.join(ctx, &inv); err != nil {
					continue
				}
				select {
				case out <- stamped{rv: inv.ResourceVersion, stamp: inv.PublishedAt.Time, spec: inv.Spec}:
				default:
				}
			}
			w.Stop()
		}
	}()
	return out
}

func next(t *testing.T, writes <-chan stamped, within time.Duration) stamped {
	t.Helper()
	select {
	case w := <-writes:
		return w
	case <-time.After(within):
		t.Fatalf("no write of the inventory within %s", within)
		return stamped{}
	}
}

// waitWrite waits for a write for which cond holds.
func waitWrite(t *testing.T, writes <-chan stamped, within time.Duration, cond func(stamped) bool) stamped {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case w := <-writes:
			if cond(w) {
				return w
			}
		case <-deadline:
			t.Fatalf("no such write of the inventory within %s", within)
			return stamped{}
		}
	}
}

// drain forgets the writes seen so far.
func drain(writes <-chan stamped) {
	for {
		select {
		case <-writes:
		default:
			return
		}
	}
}

func hasSandbox(spec v1beta1.NodeInventorySpec, id string) bool {
	return slices.ContainsFunc(spec.Sandboxes, func(e v1beta1.SandboxEntry) bool { return e.ID == id })
}
