package provider

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/shared/hostinventory"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// host stands in for sandboxd and its mirror, for the provider's own
// logic (the e2e test runs the real ones): sandboxes in a map, a switch
// for the mirror's sync, and failures to inject.
type host struct {
	mu        sync.Mutex
	sandboxes map[string]*pb.Sandbox
	synced    bool
	createErr error // returned by the next Create
	creates   int
	kills     []string
	n         int
	ended     map[string]string // why, for sandboxes that ended by themselves
	logs      []*pb.LogEntry    // every sandbox's, oldest first
	noSkip    bool              // Logs ignores skip, as a sandboxd before it
}

func newHost() *host { return &host{sandboxes: map[string]*pb.Sandbox{}, synced: true} }

// Ended implements Ender, as shared/hostinventory's Host does.
func (h *host) Ended(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended[id]
}

func (h *host) Sandboxes() ([]*pb.Sandbox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.synced {
		return nil, hostinventory.ErrNotSynced
	}
	var out []*pb.Sandbox
	for _, sb := range h.sandboxes {
		out = append(out, proto.CloneOf(sb))
	}
	return out, nil
}

func (h *host) Create(_ context.Context, req *connect.Request[pb.CreateRequest]) (*connect.Response[pb.CreateResponse], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.creates++
	if err := h.createErr; err != nil {
		h.createErr = nil
		return nil, err
	}
	h.n++
	sb := &pb.Sandbox{Id: fmt.Sprintf("sandbox%09dtag1", h.n), Template: req.Msg.GetTemplate(), Team: req.Msg.GetTeam(),
		Metadata: req.Msg.GetMetadata(), State: pb.SandboxState_SANDBOX_STATE_RUNNING, Address: fmt.Sprintf("10.0.0.%d", h.n),
		StartedAt: timestamppb.New(t0), EndAt: timestamppb.New(t0.Add(req.Msg.GetTimeout().AsDuration()))}
	h.sandboxes[sb.Id] = sb
	return connect.NewResponse(&pb.CreateResponse{Sandbox: proto.CloneOf(sb)}), nil
}

func (h *host) Kill(_ context.Context, req *connect.Request[pb.KillRequest]) (*connect.Response[pb.KillResponse], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := req.Msg.GetSandboxId()
	if _, ok := h.sandboxes[id]; !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such sandbox"))
	}
	delete(h.sandboxes, id)
	h.kills = append(h.kills, id)
	return connect.NewResponse(&pb.KillResponse{}), nil
}

func (h *host) SetTimeout(context.Context, *connect.Request[pb.SetTimeoutRequest]) (*connect.Response[pb.SetTimeoutResponse], error) {
	return connect.NewResponse(&pb.SetTimeoutResponse{}), nil
}

// Logs answers from logs as sandboxd does: the window's newest (or,
// forward, oldest) limit lines, oldest first.
func (h *host) Logs(_ context.Context, req *connect.Request[pb.LogsRequest]) (*connect.Response[pb.LogsResponse], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := req.Msg
	var window []*pb.LogEntry
	for _, e := range h.logs {
		t := e.GetTimestamp().AsTime()
		if (m.GetStart() == nil || !t.Before(m.GetStart().AsTime())) && (m.GetEnd() == nil || !t.After(m.GetEnd().AsTime())) {
			window = append(window, e)
		}
	}
	limit := int(m.GetLimit())
	skipped := int32(0)
	if m.GetForward() {
		if !h.noSkip {
			window, skipped = window[min(len(window), int(m.GetSkip())):], m.GetSkip()
		}
		window = window[:min(len(window), limit)]
	} else {
		window = window[max(0, len(window)-limit):]
	}
	return connect.NewResponse(&pb.LogsResponse{Logs: window, Skipped: skipped}), nil
}

func (h *host) set(f func(h *host)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}

// fixture is a provider over a host and a pod cache the test fills, as
// the informer would.
type fixture struct {
	p     *Provider
	h     *host
	pods  cache.Indexer
	node  *corev1.Node
	mu    sync.Mutex
	notes []*corev1.Pod
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{h: newHost(), pods: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})}
	f.node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "host-a"}}
	f.p = New(Config{Sandboxd: f.h, Mirror: f.h, Pods: corev1listers.NewPodLister(f.pods),
		Node: func() (*corev1.Node, error) { return f.node, nil }, HostIP: "192.0.2.1", DefaultTimeout: time.Hour,
		Now: func() time.Time { return t0.Add(time.Minute) }})
	f.p.NotifyPods(t.Context(), func(p *corev1.Pod) {
		f.mu.Lock()
		f.notes = append(f.notes, p)
		f.mu.Unlock()
	})
	return f
}

func (f *fixture) add(t *testing.T, name string, mod func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p := testPod(func(p *corev1.Pod) {
		p.Name, p.UID = name, types.UID("uid-"+name)
		p.Annotations = map[string]string{AnnotationTemplate: "base"}
		if mod != nil {
			mod(p)
		}
	})
	if err := f.pods.Add(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// lastNote is the last status notified for a pod.
func (f *fixture) lastNote(name string) *corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.notes) - 1; i >= 0; i-- {
		if f.notes[i].Name == name {
			return f.notes[i]
		}
	}
	return nil
}

func TestCreateAndRestartAdoption(t *testing.T) {
	f := newFixture(t)
	pod := f.add(t, "a", nil)
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	f.p.sync(t.Context())
	n := f.lastNote("a")
	if n == nil || n.Status.Phase != corev1.PodRunning || n.Status.PodIP != "10.0.0.1" {
		t.Fatalf("notified %+v", n)
	}
	// A new vk-sandbox over the same host and pods: the pod is found by its
	// link, created nowhere, and its status is the same.
	pod.Status = n.Status
	_ = f.pods.Update(pod)
	g := newFixture(t)
	g.h, g.pods = f.h, f.pods
	g.p.cfg.Sandboxd, g.p.cfg.Mirror, g.p.cfg.Pods = f.h, f.h, corev1listers.NewPodLister(f.pods)
	g.p.sync(t.Context())
	if err := g.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if f.h.creates != 1 {
		t.Errorf("%d creates, want 1", f.h.creates)
	}
	got, err := g.p.GetPod(t.Context(), "team-a", "a")
	if err != nil || got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.0.0.1" {
		t.Errorf("GetPod after the restart: %+v, %v", got, err)
	}
	if pods, _ := g.p.GetPods(t.Context()); len(pods) != 1 {
		t.Errorf("GetPods: %d pods", len(pods))
	}
}

func TestNothingIsDecidedWhileSandboxdCannotBeHeard(t *testing.T) {
	f := newFixture(t)
	// A pod that ran before vk-sandbox started, its sandbox alive.
	f.h.sandboxes["sandbox000000001tag1"] = &pb.Sandbox{Id: "sandbox000000001tag1", Team: "team-a", State: pb.SandboxState_SANDBOX_STATE_RUNNING,
		Metadata: map[string]string{MetaPodUID: "uid-a"}, StartedAt: timestamppb.New(t0), EndAt: timestamppb.New(t0.Add(time.Hour))}
	pod := f.add(t, "a", func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "sandbox", ContainerID: "skiff://sandbox000000001tag1"}}
	})
	f.h.set(func(h *host) { h.synced = false })
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	f.p.sync(t.Context())
	if n := f.lastNote("a"); n != nil || f.h.creates != 0 {
		t.Fatalf("decided while out of sync: %d creates, notified %+v", f.h.creates, n)
	}
	// Heard again: adopted, not ended.
	f.h.set(func(h *host) { h.synced = true })
	f.p.sync(t.Context())
	if n := f.lastNote("a"); n == nil || n.Status.Phase != corev1.PodRunning || f.h.creates != 0 {
		t.Fatalf("after sync: %d creates, notified %+v", f.h.creates, n)
	}
	// Its sandbox goes while vk-sandbox watches: the pod fails.
	f.h.set(func(h *host) { delete(h.sandboxes, "sandbox000000001tag1") })
	f.p.sync(t.Context())
	if n := f.lastNote("a"); n.Status.Phase != corev1.PodFailed || n.Status.Reason != ReasonSandboxKilled {
		t.Errorf("after the sandbox went: %+v", n.Status)
	}
}

// A pod whose sandbox died by itself (its envd was OOM-killed) fails with
// SandboxDied and sandboxd's words for how, which kubectl describe shows.
func TestAPodWhoseSandboxDiedSaysWhy(t *testing.T) {
	f := newFixture(t)
	pod := f.add(t, "a", nil)
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	f.p.sync(t.Context())
	const why = "the sandbox died: envd (its init) was killed by signal 9 (killed); the memory limit killed 1 process(es)"
	f.h.set(func(h *host) {
		delete(h.sandboxes, "sandbox000000001tag1")
		h.ended = map[string]string{"sandbox000000001tag1": why}
	})
	f.p.sync(t.Context())
	n := f.lastNote("a")
	if n == nil || n.Status.Phase != corev1.PodFailed || n.Status.Reason != ReasonSandboxDied || n.Status.Message != why {
		t.Fatalf("after the sandbox died: %+v", n)
	}
	if term := n.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Reason != ReasonSandboxDied || term.Message != why {
		t.Errorf("the container's state: %+v", n.Status.ContainerStatuses[0].State)
	}
}

func TestATransientCreateFailureIsRetriedNotFailed(t *testing.T) {
	f := newFixture(t)
	pod := f.add(t, "a", func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyNever })
	f.h.set(func(h *host) { h.createErr = connect.NewError(connect.CodeUnavailable, errors.New("restarting")) })
	if err := f.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatalf("CreatePod returned %v: virtual-kubelet would fail the pod", err)
	}
	f.p.mu.Lock()
	st := f.p.pods[pod.UID]
	if st.end != nil || !st.retry {
		t.Errorf("after a transient failure: end %+v retry %v", st.end, st.retry)
	}
	st.retryAt = time.Time{} // due now
	f.p.mu.Unlock()
	f.p.sync(t.Context())
	f.p.wg.Wait()
	f.p.sync(t.Context())
	if n := f.lastNote("a"); n == nil || n.Status.Phase != corev1.PodRunning || f.h.creates != 2 {
		t.Errorf("after the retry: %d creates, notified %+v", f.h.creates, n)
	}
	// A refusal is final.
	bad := f.add(t, "b", nil)
	f.h.set(func(h *host) {
		h.createErr = connect.NewError(connect.CodeInvalidArgument, errors.New("template: this host has no template"))
	})
	if err := f.p.CreatePod(t.Context(), bad); err != nil {
		t.Fatal(err)
	}
	f.p.sync(t.Context())
	if n := f.lastNote("b"); n == nil || n.Status.Phase != corev1.PodFailed || n.Status.Reason != ReasonRejected {
		t.Errorf("refused: %+v", n)
	}
}

func TestDeleteKillsOrReleases(t *testing.T) {
	f := newFixture(t)
	a := f.add(t, "a", nil)
	b := f.add(t, "b", nil)
	for _, p := range []*corev1.Pod{a, b} {
		if err := f.p.CreatePod(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	f.p.sync(t.Context())
	// a: deleted by a user on a Ready node.
	if err := f.p.DeletePod(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	// b: evicted by the taint manager while the node was unreachable.
	f.node.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
	b.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByTaintManager"}}
	if err := f.p.DeletePod(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if len(f.h.kills) != 1 || len(f.h.sandboxes) != 1 {
		t.Fatalf("kills %v, left %d sandboxes", f.h.kills, len(f.h.sandboxes))
	}
	f.p.sync(t.Context())
	if n := f.lastNote("a"); n.Status.Phase != corev1.PodFailed || n.Status.Reason != ReasonKilled {
		t.Errorf("a: %+v", n.Status)
	}
	if n := f.lastNote("b"); n.Status.Phase != corev1.PodFailed || n.Status.Reason != ReasonReleased {
		t.Errorf("b: %+v", n.Status)
	}
	// b's pod is gone from the API: its sandbox is no pod (virtual-kubelet's
	// start-up sweep never sees it), and a late DeletePod from a pod
	// informer's delete event finds nothing to kill.
	_ = f.pods.Delete(b)
	if _, err := f.p.GetPod(t.Context(), "team-a", "b"); err == nil {
		t.Error("GetPod found the released pod")
	}
	if pods, _ := f.p.GetPods(t.Context()); len(pods) != 1 || pods[0].Name != "a" {
		t.Errorf("GetPods: %v", pods)
	}
	if err := f.p.DeletePod(t.Context(), b); err != nil || len(f.h.kills) != 1 {
		t.Errorf("a second DeletePod: %v, kills %v", err, f.h.kills)
	}
}

func TestSandboxesWithoutAPodLinkAreNeverTouched(t *testing.T) {
	f := newFixture(t)
	f.h.sandboxes["e2bsandbox00000ftag1"] = &pb.Sandbox{Id: "e2bsandbox00000ftag1", Team: "team-a", State: pb.SandboxState_SANDBOX_STATE_RUNNING,
		Metadata: map[string]string{"purpose": "e2b"}}
	// A terminal pod whose name matches nothing: the sync kills only
	// sandboxes linked to terminal pods.
	f.add(t, "done", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })
	f.p.sync(t.Context())
	if pods, _ := f.p.GetPods(t.Context()); len(pods) != 0 || len(f.h.kills) != 0 || len(f.notes) != 0 {
		t.Errorf("pods %v, kills %v, notes %d", pods, f.h.kills, len(f.notes))
	}
}

func TestADeleteWaitsForSandboxdToBeHeard(t *testing.T) {
	f := newFixture(t)
	f.h.sandboxes["sandbox000000001tag1"] = &pb.Sandbox{Id: "sandbox000000001tag1", Team: "team-a", State: pb.SandboxState_SANDBOX_STATE_RUNNING,
		Metadata: map[string]string{MetaPodUID: "uid-a"}, StartedAt: timestamppb.New(t0), EndAt: timestamppb.New(t0.Add(time.Hour))}
	pod := f.add(t, "a", nil)
	f.h.set(func(h *host) { h.synced = false })
	// A fresh vk-sandbox, sandboxd unheard: the pod's sandbox cannot be
	// seen, so the deletion fails (and is tried again), never "nothing to kill".
	if err := f.p.DeletePod(t.Context(), pod); err == nil {
		t.Fatal("DeletePod succeeded without seeing the pod's sandbox")
	}
	f.h.set(func(h *host) { h.synced = true })
	if err := f.p.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if len(f.h.kills) != 1 || f.h.kills[0] != "sandbox000000001tag1" {
		t.Errorf("kills %v", f.h.kills)
	}
}
