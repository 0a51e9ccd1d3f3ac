package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// source is an inventory the test sets, standing in for the mirror of a
// sandboxd (the e2e test runs the real one).
type source struct {
	mu      sync.Mutex
	inv     *v1beta1.NodeInventory
	err     error
	changes chan struct{}
}

func newSource(node string, sandboxes int) *source {
	s := &source{changes: make(chan struct{}, 1)}
	s.set(node, sandboxes)
	return s
}

func (s *source) Inventory() (*v1beta1.NodeInventory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	return s.inv.DeepCopy(), nil
}

// set makes the host hold n sandboxes, and signals a change.
func (s *source) set(node string, n int) {
	info := &pb.InfoResponse{NodeName: node, Capacity: &pb.Resources{CpuMilli: 8000, MemoryMib: 16384}, MaxSandboxes: 64,
		Templates: []*pb.TemplateVersion{{Name: "base", Version: "v1"}}}
	var sbs []*pb.Sandbox
	for i := range n {
		sbs = append(sbs, sandbox(i, nil))
	}
	s.mu.Lock()
	s.inv = &v1beta1.NodeInventory{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec:       hostinventory.Spec("127.0.0.1:27777", info, sbs),
	}
	s.mu.Unlock()
	s.signal()
}

func (s *source) setErr(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
	s.signal()
}

func (s *source) signal() {
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

func sandbox(i int, meta map[string]string) *pb.Sandbox {
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	return &pb.Sandbox{
		Id: fmt.Sprintf("s%015dtag1", i), Template: "base", State: pb.SandboxState_SANDBOX_STATE_RUNNING, Team: "team-a",
		StartedAt: timestamppb.New(start), EndAt: timestamppb.New(start.Add(time.Hour)),
		Resources: &pb.Resources{CpuMilli: 1000, MemoryMib: 512}, Metadata: meta,
	}
}

// run runs an applier until the test ends, and checks that it stopped
// with ctx's error.
func run(t *testing.T, a *InventoryApplier) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// stamped is one write of the inventory as a watch saw it.
type stamped struct {
	rv    string
	stamp time.Time
	spec  v1beta1.NodeInventorySpec
}

// watchWrites reports every write of the node's inventory.
func watchWrites(t *testing.T, dyn dynamic.Interface, node string) <-chan stamped {
	t.Helper()
	w, err := dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)).Watch(t.Context(),
		metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	out := make(chan stamped, 100)
	go func() {
		defer close(out)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				t.Errorf("the inventory of %s was deleted", node)
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ev.Object)
			if err != nil {
				t.Error(err)
				return
			}
			var inv v1beta1.NodeInventory
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, &inv); err != nil {
				t.Error(err)
				return
			}
			if inv.PublishedAt == nil {
				t.Error("a write without publishedAt")
				continue
			}
			out <- stamped{rv: inv.ResourceVersion, stamp: inv.PublishedAt.Time, spec: inv.Spec}
		}
	}()
	return out
}

func next(t *testing.T, writes <-chan stamped, within time.Duration) stamped {
	t.Helper()
	select {
	case w, ok := <-writes:
		if !ok {
			t.Fatal("the watch ended")
		}
		return w
	case <-time.After(within):
		t.Fatalf("no write within %s", within)
		return stamped{}
	}
}

func TestApplierStampsEveryIntervalAndNothingMore(t *testing.T) {
	env := kubetest.Start(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	const node = "host-stamp"
	writes := watchWrites(t, dyn, node)
	src := newSource(node, 2)
	interval := 2 * time.Second
	reg := prometheus.NewRegistry()
	run(t, New(Config{Source: src, Writer: NewKubeWriter(dyn, Options{}), Changes: src.changes, NodeName: node,
		Options: Options{Interval: interval, MinInterval: 100 * time.Millisecond}, Metrics: NewMetrics(reg)}))

	first := next(t, writes, 30*time.Second)
	if len(first.spec.Sandboxes) != 2 || first.spec.Allocated.Sandboxes != 2 {
		t.Fatalf("first write: %+v", first.spec)
	}
	// Nothing changes: the stamp still advances on every interval, and
	// nothing is written in between (a stamp is whole seconds, so two
	// writes an interval apart are at least interval-1s apart on it).
	prev := first
	for range 3 {
		// Changes that change nothing are not writes either.
		src.signal()
		w := next(t, writes, 10*interval)
		if !equality.Semantic.DeepEqual(w.spec, first.spec) {
			t.Errorf("the spec changed without a change: %+v", w.spec)
		}
		if gap := w.stamp.Sub(prev.stamp); gap < interval-time.Second {
			t.Errorf("stamp %s came %s after %s: more often than the interval %s", w.stamp, gap, prev.stamp, interval)
		}
		prev = w
	}
	// The metrics count after the apply returns, which may be after the
	// watch saw the write.
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, reg, "written") < 4 || counter(t, reg, "unchanged") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("written = %v, want at least 4; unchanged = %v, want the signals without a change skipped",
				counter(t, reg, "written"), counter(t, reg, "unchanged"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestApplierPublishesAChangeWithinTheMinInterval(t *testing.T) {
	env := kubetest.Start(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	const node = "host-change"
	writes := watchWrites(t, dyn, node)
	src := newSource(node, 1)
	// An interval far beyond the test: every write after the first is a
	// change's.
	run(t, New(Config{Source: src, Writer: NewKubeWriter(dyn, Options{}), Changes: src.changes, NodeName: node,
		Options: Options{Interval: time.Hour, MinInterval: time.Second}}))
	first := next(t, writes, 30*time.Second)
	if len(first.spec.Sandboxes) != 1 {
		t.Fatalf("first write: %+v", first.spec)
	}
	// A burst of changes is at most a few writes, the last one with every
	// sandbox.
	for n := 2; n <= 6; n++ {
		src.set(node, n)
	}
	var got []stamped
	for len(got) == 0 || len(got[len(got)-1].spec.Sandboxes) != 6 {
		got = append(got, next(t, writes, 30*time.Second))
	}
	// Five changes at once, far inside the 1 s min interval: one write,
	// or two if the first change's was already under way.
	if len(got) > 2 {
		t.Errorf("%d writes for a burst of 5 changes inside one min interval, want at most 2", len(got))
	}
	// Back to one sandbox: the entries that went are removed by the apply.
	src.set(node, 1)
	for w := next(t, writes, 30*time.Second); len(w.spec.Sandboxes) != 1; w = next(t, writes, 30*time.Second) {
	}
	// The published spec is exactly the source's.
	inv, _ := src.Inventory()
	cur := get(t, dyn, node)
	if !equality.Semantic.DeepEqual(cur.Spec, inv.Spec) {
		t.Errorf("published %+v, want %+v", cur.Spec, inv.Spec)
	}
}

func TestApplierStopsStampingOutOfSyncAndNeverDeletes(t *testing.T) {
	env := kubetest.Start(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	const node = "host-sync"
	writes := watchWrites(t, dyn, node)
	src := newSource(node, 1)
	interval := time.Second
	stop := run(t, New(Config{Source: src, Writer: NewKubeWriter(dyn, Options{}), Changes: src.changes, NodeName: node,
		Options: Options{Interval: interval, MinInterval: 100 * time.Millisecond}}))
	next(t, writes, 30*time.Second)
	next(t, writes, 10*interval)

	// sandboxd goes away: no more stamps, and the inventory stays.
	src.setErr(hostinventory.ErrNotSynced)
	// A write already under way when the mirror lost sync may still land.
	time.Sleep(interval)
	before := get(t, dyn, node)
	select {
	case w := <-writes:
		if w.rv != before.ResourceVersion {
			t.Fatalf("written while out of sync: %+v", w)
		}
	case <-time.After(4 * interval):
	}
	if after := get(t, dyn, node); after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("the inventory changed while out of sync: rv %s -> %s", before.ResourceVersion, after.ResourceVersion)
	}

	// Back in sync: stamped again at once.
	src.setErr(nil)
	for w := next(t, writes, 30*time.Second); w.rv == before.ResourceVersion; w = next(t, writes, 30*time.Second) {
	}
	// Stopped: no final write, no delete.
	stop()
	last := get(t, dyn, node)
	time.Sleep(2 * interval)
	if cur := get(t, dyn, node); cur.ResourceVersion != last.ResourceVersion {
		t.Errorf("written after Run returned: rv %s -> %s", last.ResourceVersion, cur.ResourceVersion)
	}
}

func TestApplierRefusesAnotherHost(t *testing.T) {
	src := newSource("host-b", 0)
	a := New(Config{Source: src, Writer: writerFunc(func(context.Context, *v1beta1.NodeInventory) error {
		t.Error("applied another host's inventory")
		return nil
	}), Changes: src.changes, NodeName: "host-a", Options: NewOptions()})
	if err := a.Run(t.Context()); !errors.Is(err, ErrWrongHost) {
		t.Fatalf("Run = %v, want ErrWrongHost", err)
	}
}

type writerFunc func(context.Context, *v1beta1.NodeInventory) error

func (f writerFunc) Apply(ctx context.Context, inv *v1beta1.NodeInventory) error { return f(ctx, inv) }

// An inventory of 2,000 sandboxes, built the way the publisher builds it
// and stored by a real kube-apiserver with the managed fields server-side
// apply adds, stays under 1 MiB with every sandbox's metadata at its bound,
// and well under it with the metadata of a pod's sandbox.
func TestInventoryOf2000SandboxesStoredUnder1MiB(t *testing.T) {
	env := kubetest.Start(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	podLink := map[string]string{
		"skiff.dev/pod-uid": "3f1c9a52-6f0e-4b8e-9d36-2b3e8f7a1c44",
		"skiff.dev/pod":     "worker-7c9f8d6b5-x2x9q",
	}
	bound := map[string]string{"purpose": strings.Repeat("p", v1beta1.MaxSandboxMetadataBytes-88-5*6-len("purpose"))}
	for k, v := range podLink {
		bound[k] = v
	}
	for i := range 5 {
		bound[fmt.Sprintf("key-%d", i)] = "v"
	}
	tests := []struct {
		name  string
		meta  map[string]string
		limit int
	}{
		{"metadata at its bound", bound, 1 << 20},
		{"a pod's link", podLink, 768 << 10},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total := 0
			for k, v := range tt.meta {
				total += len(k) + len(v)
			}
			if total > v1beta1.MaxSandboxMetadataBytes || len(tt.meta) > 8 {
				t.Fatalf("test metadata is %d bytes in %d entries, beyond the bound", total, len(tt.meta))
			}
			node := fmt.Sprintf("sandbox-host-%04d.example.internal", i)
			info := &pb.InfoResponse{NodeName: node, Capacity: &pb.Resources{CpuMilli: 256000, MemoryMib: 1 << 20}, MaxSandboxes: 2000,
				Templates: []*pb.TemplateVersion{{Name: "code-interpreter-v1", Version: "0123456789ab"}}}
			var sbs []*pb.Sandbox
			for i := range 2000 {
				sb := sandbox(i, tt.meta)
				sb.Template, sb.Team, sb.Pool = "code-interpreter-v1", "team-analytics", "team-analytics/code-interp"
				sbs = append(sbs, sb)
			}
			inv := &v1beta1.NodeInventory{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
				ObjectMeta: metav1.ObjectMeta{Name: node},
				Spec:       hostinventory.Spec("10.20.30.40:27777", info, sbs),
			}
			stamp := metav1.Now()
			inv.PublishedAt = &stamp
			body, err := json.Marshal(inv)
			if err != nil {
				t.Fatal(err)
			}
			if err := NewKubeWriter(dyn, Options{}).Apply(t.Context(), inv); err != nil {
				t.Fatal(err)
			}
			u, err := dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)).Get(t.Context(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stored, err := json.Marshal(u.Object)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("2,000 sandboxes, %d bytes of metadata each: apply body %d bytes, stored object with managed fields %d bytes (%.0f per sandbox)",
				total, len(body), len(stored), float64(len(stored))/2000)
			if len(stored) >= tt.limit {
				t.Errorf("stored inventory is %d bytes, want under %d", len(stored), tt.limit)
			}
		})
	}
}

func get(t *testing.T, dyn dynamic.Interface, node string) *v1beta1.NodeInventory {
	t.Helper()
	u, err := dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)).Get(t.Context(), node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		t.Fatalf("the inventory of %s is gone", node)
	}
	if err != nil {
		t.Fatal(err)
	}
	var inv v1beta1.NodeInventory
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &inv); err != nil {
		t.Fatal(err)
	}
	return &inv
}

func counter(t *testing.T, reg *prometheus.Registry, o string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "skiff_vk_sandbox_inventory_publishes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == o {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A publish of an unchanged spec is a stamp alone (a merge patch of
// publishedAt, an Update in managedFields, not the whole inventory); when
// someone else changed the stored inventory since, the stamp's
// precondition fails and the whole inventory is applied again, restoring
// it.
func TestStampOnlyWhileTheStoredInventoryIsTheOneWritten(t *testing.T) {
	env := kubetest.Start(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	res := dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource))
	const node = "host-stamp-only"
	writes := watchWrites(t, dyn, node)
	src := newSource(node, 3)
	interval := time.Second
	run(t, New(Config{Source: src, Writer: NewKubeWriter(dyn, Options{}), Changes: src.changes, NodeName: node,
		Options: Options{Interval: interval, MinInterval: 100 * time.Millisecond}}))
	first := next(t, writes, 30*time.Second)
	second := next(t, writes, 10*interval)
	if !second.stamp.After(first.stamp) || !equality.Semantic.DeepEqual(second.spec, first.spec) {
		t.Fatalf("second write: stamp %s after %s, spec %+v", second.stamp, first.stamp, second.spec)
	}
	stored, err := res.Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var stamped bool
	for _, m := range stored.GetManagedFields() {
		if m.Manager == FieldManager && m.Operation == metav1.ManagedFieldsOperationUpdate && m.FieldsV1 != nil && strings.Contains(m.FieldsV1.GetRawString(), "publishedAt") {
			stamped = true
		}
	}
	if !stamped {
		t.Errorf("no stamp-only write: managed fields %+v", stored.GetManagedFields())
	}

	// Someone else changes the stored inventory: the next publish applies
	// it whole.
	if _, err := res.Patch(t.Context(), node, types.MergePatchType, []byte(`{"spec":{"endpoint":"elsewhere:27777"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * interval)
	for {
		select {
		case w := <-writes:
			if w.spec.Endpoint == first.spec.Endpoint && w.stamp.After(second.stamp) {
				return
			}
		case <-deadline:
			t.Fatalf("the changed inventory was not applied whole again within %s", 10*interval)
		}
	}
}
