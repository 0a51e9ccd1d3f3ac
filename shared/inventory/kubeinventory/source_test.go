package kubeinventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// now is the readers' clock in these tests; stamps are whole seconds, as
// metav1.Time serialises them.
var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// node is an inventory published at stamp (nil: never stamped).
func node(name string, stamp *time.Time) *v1beta1.NodeInventory {
	inv := &v1beta1.NodeInventory{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: name + ":27777",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 8000, MemoryMiB: 16384, Sandboxes: 50},
		},
	}
	if stamp != nil {
		inv.PublishedAt = &metav1.Time{Time: *stamp}
	}
	return inv
}

// ago returns a stamp d before now.
func ago(d time.Duration) *time.Time {
	t := now.Add(-d)
	return &t
}

func newSource(t *testing.T, opts Options, invs ...*v1beta1.NodeInventory) *Source {
	t.Helper()
	return New(newReader(t, invs...), opts)
}

// newReader is a fake client: the filter is pure logic over what a reader
// returns; the control-plane test covers the real informer path.
func newReader(t *testing.T, invs ...*v1beta1.NodeInventory) client.Reader {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objs := make([]client.Object, 0, len(invs))
	for _, inv := range invs {
		objs = append(objs, inv)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func withClock(o Options) Options {
	o.Clock = clocktesting.NewFakePassiveClock(now)
	return o
}

func listNames(t *testing.T, s *Source) []string {
	t.Helper()
	invs, err := s.ListNodes(t.Context())
	if err != nil {
		t.Fatalf("ListNodes: %v", err)
	}
	names := make([]string, 0, len(invs))
	for _, inv := range invs {
		names = append(names, inv.Name)
	}
	slices.Sort(names)
	return names
}

func assertNames(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("nodes = %v, want %v", got, want)
	}
}

// A live publisher sets the reference; a dead node exactly the window behind
// it stays, one second more and it is gone, from the list and from lookups.
func TestDeadNodeAgainstLivePublisher(t *testing.T) {
	s := newSource(t, withClock(NewOptions()),
		node("live", ago(0)),
		node("dead-90s", ago(90*time.Second)),
		node("dead-91s", ago(91*time.Second)),
	)
	assertNames(t, listNames(t, s), "dead-90s", "live")
	if got, want := s.reference().at, now.UnixNano(); got != want {
		t.Fatalf("reference = %d, want %d (the live stamp)", got, want)
	}
	if _, err := s.NodeInventory(t.Context(), "dead-90s"); err != nil {
		t.Fatalf("NodeInventory(dead-90s) = %v, want it kept", err)
	}
	if _, err := s.NodeInventory(t.Context(), "dead-91s"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInventory(dead-91s) = %v, want NotFound", err)
	}
}

// A control-plane outage freezes every stamp together: ten minutes later,
// with the reader's clock far ahead, nothing leaves.
func TestFleetPublishOutage(t *testing.T) {
	s := newSource(t, withClock(NewOptions()),
		node("a", ago(10*time.Minute)),
		node("b", ago(10*time.Minute+20*time.Second)),
		node("c", ago(10*time.Minute+30*time.Second)),
	)
	assertNames(t, listNames(t, s), "a", "b", "c")
	for _, name := range []string{"a", "b", "c"} {
		if _, err := s.NodeCapacity(t.Context(), name); err != nil {
			t.Errorf("NodeCapacity(%s) = %v, want fresh", name, err)
		}
	}
}

// A publisher whose clock runs an hour ahead does not become the reference:
// now caps it, and live nodes stay.
func TestRogueStampAhead(t *testing.T) {
	s := newSource(t, withClock(NewOptions()),
		node("rogue", ago(-time.Hour)),
		node("a", ago(30*time.Second)),
		node("b", ago(85*time.Second)),
	)
	assertNames(t, listNames(t, s), "a", "b", "rogue")
	if got, want := s.reference().at, now.UnixNano(); got != want {
		t.Fatalf("reference = %s, want now %s", time.Unix(0, got).UTC(), now)
	}
	if _, err := s.NodeInventory(t.Context(), "b"); err != nil {
		t.Fatalf("NodeInventory(b) = %v, want fresh", err)
	}
}

// Before the first list there is no reference, and every node is fresh.
func TestLookupBeforeList(t *testing.T) {
	s := newSource(t, withClock(NewOptions()),
		node("live", ago(0)),
		node("old", ago(time.Hour)),
	)
	if _, err := s.NodeInventory(t.Context(), "old"); err != nil {
		t.Fatalf("NodeInventory(old) before any list = %v, want fresh", err)
	}
	if _, err := s.NodeCapacity(t.Context(), "old"); err != nil {
		t.Fatalf("NodeCapacity(old) before any list = %v, want fresh", err)
	}
	// The first list sets the reference; from then on the lookup filters.
	assertNames(t, listNames(t, s), "live")
	if _, err := s.NodeInventory(t.Context(), "old"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInventory(old) after a list = %v, want NotFound", err)
	}
}

func TestCustomStaleAfter(t *testing.T) {
	opts := NewOptions()
	opts.StaleAfter = 10 * time.Second
	s := newSource(t, withClock(opts),
		node("live", ago(0)),
		node("at-window", ago(10*time.Second)),
		node("past-window", ago(11*time.Second)),
		node("default-window", ago(60*time.Second)),
	)
	assertNames(t, listNames(t, s), "at-window", "live")
}

// A node that was never stamped (an old publisher, or a CRD that pruned the
// field) counts as fresh, and does not move the reference.
func TestMissingStamp(t *testing.T) {
	s := newSource(t, withClock(NewOptions()),
		node("unstamped", nil),
		node("live", ago(0)),
		node("dead", ago(5*time.Minute)),
	)
	assertNames(t, listNames(t, s), "live", "unstamped")
	if _, err := s.NodeInventory(t.Context(), "unstamped"); err != nil {
		t.Fatalf("NodeInventory(unstamped) = %v, want fresh", err)
	}

	// A fleet with no readable stamp at all keeps everything and stores no
	// reference.
	s = newSource(t, withClock(NewOptions()), node("x", nil), node("y", nil))
	assertNames(t, listNames(t, s), "x", "y")
	if got := s.reference().at; got != 0 {
		t.Fatalf("reference = %d, want 0 with no stamps", got)
	}
}

// A stamp the reader cannot turn into nanoseconds counts as fresh, and never
// becomes the reference.
func TestUnreadableStamp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stamp time.Time
	}{
		{"zero", time.Time{}},
		{"epoch", time.Unix(0, 0)},
		{"before epoch", time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"past int64 nanoseconds", time.Date(2262, 4, 12, 0, 0, 0, 0, time.UTC)},
		{"year 9999", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSource(t, withClock(NewOptions()),
				node("odd", &tc.stamp),
				node("live", ago(time.Minute)),
				node("dead", ago(time.Minute+91*time.Second)),
			)
			assertNames(t, listNames(t, s), "live", "odd")
			if got, want := s.reference().at, now.Add(-time.Minute).UnixNano(); got != want {
				t.Fatalf("reference = %s, want the live stamp %s", time.Unix(0, got).UTC(), now.Add(-time.Minute))
			}
			if _, err := s.NodeInventory(t.Context(), "odd"); err != nil {
				t.Fatalf("NodeInventory(odd) = %v, want fresh", err)
			}
		})
	}
}

func TestStampNanos(t *testing.T) {
	last := time.Unix(maxStampSeconds-1, 999_999_999)
	for _, tc := range []struct {
		name   string
		stamp  *metav1.Time
		want   int64
		wantOK bool
	}{
		{"nil", nil, 0, false},
		{"zero", &metav1.Time{}, 0, false},
		{"epoch", &metav1.Time{Time: time.Unix(0, 0)}, 0, false},
		{"just before epoch", &metav1.Time{Time: time.Unix(-1, 0)}, 0, false},
		{"first second after epoch", &metav1.Time{Time: time.Unix(1, 0)}, int64(time.Second), true},
		{"now", &metav1.Time{Time: now}, now.UnixNano(), true},
		{"now in another zone", &metav1.Time{Time: now.In(time.FixedZone("x", 5*3600))}, now.UnixNano(), true},
		{"last representable second", &metav1.Time{Time: last}, last.UnixNano(), true},
		{"first second that may overflow", &metav1.Time{Time: time.Unix(maxStampSeconds, 0)}, 0, false},
		{"far future", &metav1.Time{Time: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := stampNanos(tc.stamp)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("stampNanos = (%d, %v), want (%d, %v)", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// Absent and stale nodes are both NotFound for nodeinventories.skiff.dev, from
// both lookups; the stale one says why.
func TestNotFoundContract(t *testing.T) {
	s := newSource(t, withClock(NewOptions()), node("live", ago(0)), node("stale", ago(2*time.Minute)))
	assertNames(t, listNames(t, s), "live")

	lookups := map[string]func(ctx context.Context, name string) error{
		"NodeInventory": func(ctx context.Context, name string) error { _, err := s.NodeInventory(ctx, name); return err },
		"NodeCapacity":  func(ctx context.Context, name string) error { _, err := s.NodeCapacity(ctx, name); return err },
	}
	for lookup, fn := range lookups {
		for _, name := range []string{"absent", "stale"} {
			t.Run(lookup+"/"+name, func(t *testing.T) {
				err := fn(t.Context(), name)
				if !apierrors.IsNotFound(err) {
					t.Fatalf("err = %v, want NotFound", err)
				}
				var status apierrors.APIStatus
				if !errors.As(err, &status) {
					t.Fatalf("err = %v, want an APIStatus inside", err)
				}
				d := status.Status().Details
				if d == nil || d.Group != "skiff.dev" || d.Kind != "nodeinventories" || d.Name != name {
					t.Fatalf("details = %+v, want nodeinventories.skiff.dev %q", d, name)
				}
				if name == "stale" && !strings.Contains(err.Error(), "stale, 2m0s behind") {
					t.Fatalf("err = %q, want it to say how stale", err)
				}
			})
		}
	}

	inv, err := s.NodeInventory(t.Context(), "live")
	if err != nil || inv.Name != "live" {
		t.Fatalf("NodeInventory(live) = %v, %v", inv, err)
	}
	got, err := s.NodeCapacity(t.Context(), "live")
	if err != nil || got != node("live", nil).Spec.Capacity {
		t.Fatalf("NodeCapacity(live) = %+v, %v", got, err)
	}
}

// The reference follows the fleet: it moves back when the newest node leaves
// the list, and lookups use the latest stored one.
func TestReferenceFollowsLatestList(t *testing.T) {
	c := clocktesting.NewFakePassiveClock(now)
	reader := newReader(t, node("a", ago(0)), node("b", ago(80*time.Second)))
	s := New(reader, Options{Clock: c})
	assertNames(t, listNames(t, s), "a", "b")

	// Node a leaves the cluster; b is now the newest.
	if err := reader.(client.Client).Delete(t.Context(), node("a", nil)); err != nil {
		t.Fatal(err)
	}
	assertNames(t, listNames(t, s), "b")
	if got, want := s.reference().at, now.Add(-80*time.Second).UnixNano(); got != want {
		t.Fatalf("reference = %s, want b's stamp", time.Unix(0, got).UTC())
	}
}

func TestNewDefaults(t *testing.T) {
	s := New(newReader(t), Options{})
	if s.staleAfter != DefaultStaleAfter {
		t.Errorf("staleAfter = %s, want %s", s.staleAfter, DefaultStaleAfter)
	}
	if s.grace != 30*time.Second {
		t.Errorf("grace = %s, want 30s, a third of the default window", s.grace)
	}
	if s := New(newReader(t), Options{StaleAfter: 6 * time.Second}); s.grace != 2*time.Second {
		t.Errorf("grace = %s with a 6s window, want 2s", s.grace)
	}
	if s.clock == nil {
		t.Error("clock is nil, want the real clock")
	}
}

// Warm candidates come only from fresh nodes, and a warm lookup advances the
// reference like a list.
func TestWarmCandidatesFresh(t *testing.T) {
	warm := func(inv *v1beta1.NodeInventory, id string) *v1beta1.NodeInventory {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxWarm})
		return inv
	}
	s := newSource(t, withClock(NewOptions()),
		warm(node("live", ago(0)), "live-warm"),
		warm(node("edge", ago(90*time.Second)), "edge-warm"),
		warm(node("dead", ago(91*time.Second)), "dead-warm"),
	)
	if got, err := s.WarmCandidates(t.Context(), "base", 0); err != nil || got != nil {
		t.Fatalf("WarmCandidates(limit 0) = %v, %v; want nothing", got, err)
	}
	if got := s.reference().at; got != 0 {
		t.Fatalf("reference = %d after a zero-limit call, want 0", got)
	}
	got, err := s.WarmCandidates(t.Context(), "base", 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range got {
		ids = append(ids, c.SandboxID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"edge-warm", "live-warm"}) {
		t.Fatalf("WarmCandidates = %v, want the fresh nodes' two", ids)
	}
	if _, err := s.NodeInventory(t.Context(), "dead"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInventory(dead) after WarmCandidates = %v, want NotFound", err)
	}
}

// failingReader fails every read, as a cache that is not synced or a client
// that cannot reach the server does.
type failingReader struct{ client.Reader }

var errUnavailable = errors.New("connection refused")

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errUnavailable
}

func (failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errUnavailable
}

// A read error is wrapped and passed on; it is never a NotFound, so a caller
// cannot mistake an outage for a dead node.
func TestReadErrors(t *testing.T) {
	s := New(failingReader{}, withClock(NewOptions()))
	ctx := t.Context()
	_, listErr := s.ListNodes(ctx)
	_, invErr := s.NodeInventory(ctx, "n")
	_, capErr := s.NodeCapacity(ctx, "n")
	_, warmErr := s.WarmCandidates(ctx, "base", 1)
	for name, err := range map[string]error{"ListNodes": listErr, "NodeInventory": invErr, "NodeCapacity": capErr, "WarmCandidates": warmErr} {
		if !errors.Is(err, errUnavailable) || apierrors.IsNotFound(err) {
			t.Errorf("%s = %v, want the read error, not NotFound", name, err)
		}
	}
}

// A sharded node's entries are its own (first) and its shards', in shard
// order; a shard whose spec names another node or index than its name is
// not joined; the joined resourceVersion is the newest of the inventory's
// and its shards'.
func TestJoinShards(t *testing.T) {
	entry := func(id string) v1beta1.SandboxEntry {
		// A valid ID (20 lowercase letters and digits): id, padded with z.
		e := v1beta1.SandboxEntry{ID: id + strings.Repeat("z", 20-len(id)), Template: "base", State: v1beta1.SandboxWarm, StartedAt: v1beta1.NewMicroTime(now), Metadata: map[string]string{"k": id}}
		if strings.HasPrefix(id, "bad") {
			e.State = v1beta1.SandboxRunning // without a team: the schema would refuse it
		}
		return e
	}
	shard := func(name, node string, index int32, ids ...string) *v1beta1.NodeInventoryShard {
		sh := &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1beta1.NodeInventoryShardSpec{Node: node, Index: index}}
		for _, id := range ids {
			sh.Spec.Sandboxes = append(sh.Spec.Sandboxes, entry(id))
		}
		return sh
	}
	inv := node("a", ago(0))
	inv.Spec.SandboxShards = 4
	inv.Spec.Sandboxes = []v1beta1.SandboxEntry{entry("own")}
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// The fake client numbers resourceVersions in the order it writes.
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(inv,
		shard("a-s0", "a", 0, "x0", "x1"),
		shard("a-s1", "b", 1, "stolen"),               // names another node
		packed(t, shard("a-s2", "a", 2, "x2", "bad")), // packed; its second entry invalid
		shard("a-s3", "a", 1, "misfiled"),             // names another index
		shard("a-s4", "a", 4, "beyond"),               // past spec.sandboxShards
	).Build()
	rvOf := func(obj client.Object) uint64 {
		if err := reader.Get(t.Context(), client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		rv, _ := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
		return rv
	}
	src := New(reader, withClock(NewOptions()))
	gets := []struct {
		name string
		get  func() (*v1beta1.NodeInventory, error)
	}{
		{"ListNodes", func() (*v1beta1.NodeInventory, error) {
			invs, err := src.ListNodes(t.Context())
			if err != nil || len(invs) != 1 {
				return nil, fmt.Errorf("ListNodes: %d, %w", len(invs), err)
			}
			return &invs[0], nil
		}},
		{"NodeInventory", func() (*v1beta1.NodeInventory, error) { return src.NodeInventory(t.Context(), "a") }},
		{"ListNodesShared", func() (*v1beta1.NodeInventory, error) {
			invs, err := src.ListNodesShared(t.Context())
			if err != nil || len(invs) != 1 {
				return nil, fmt.Errorf("ListNodesShared: %d, %w", len(invs), err)
			}
			return &invs[0], nil
		}},
	}
	check := func(step string, wantIDs []string, wantRV uint64) {
		t.Helper()
		for _, g := range gets {
			got, err := g.get()
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, e := range got.Spec.Sandboxes {
				ids = append(ids, strings.TrimRight(e.ID, "z"))
			}
			if !slices.Equal(ids, wantIDs) {
				t.Errorf("%s, %s: joined sandboxes %v, want %v", step, g.name, ids, wantIDs)
			}
			if want := strconv.FormatUint(wantRV, 10); got.ResourceVersion != want {
				t.Errorf("%s, %s: joined resourceVersion %s, want %s (the newest of the inventory and its joined shards)", step, g.name, got.ResourceVersion, want)
			}
		}
	}
	s0, s2 := shard("a-s0", "a", 0), packed(t, shard("a-s2", "a", 2))
	check("as made", []string{"own", "x0", "x1", "x2"}, max(rvOf(s0), rvOf(s2)))

	// A shard written again (twice, so that its version is more than one
	// past any before) is joined again; its version is now the newest.
	rvOf(s0)
	for _, id := range []string{"x3", ""} {
		if id != "" {
			s0.Spec.Sandboxes = append(s0.Spec.Sandboxes, entry(id))
		}
		s0.Annotations = map[string]string{"write": id}
		if err := reader.Update(t.Context(), s0); err != nil {
			t.Fatal(err)
		}
	}
	check("after a shard changed", []string{"own", "x0", "x1", "x3", "x2"}, rvOf(s0))

	// The inventory written after its shards: its own version is the
	// newest. (The fake client counts each object's versions apart: write
	// it until its version passes the shard's.)
	stamped := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	for i := 0; rvOf(stamped) <= rvOf(s0); i++ {
		stamped.Spec.Endpoint = fmt.Sprintf("a:%d", 27778+i)
		if err := reader.Update(t.Context(), stamped); err != nil {
			t.Fatal(err)
		}
	}
	check("after the inventory changed", []string{"own", "x0", "x1", "x3", "x2"}, rvOf(stamped))

	// ListNodes' entries are the caller's: writing to them changes no
	// later answer, shared or not.
	owned, err := src.ListNodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i := range owned[0].Spec.Sandboxes {
		owned[0].Spec.Sandboxes[i].Metadata["k"] = "written"
	}
	shared, err := src.ListNodesShared(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range shared[0].Spec.Sandboxes {
		if e.Metadata["k"] != strings.TrimRight(e.ID, "z") {
			t.Errorf("sandbox %s's metadata %v after a caller wrote to ListNodes' copy, want k=%s", e.ID, e.Metadata, e.ID)
		}
	}

	cands, err := src.WarmCandidates(t.Context(), "base", 10)
	if err != nil || len(cands) != 5 {
		t.Fatalf("WarmCandidates = %+v, %v; want the 5 joined", cands, err)
	}

	// A shard written before the inventory but reaching the cache after
	// it (its version older than the inventory's): the joined version
	// still moves on, once, so that readers that skip an unchanged
	// version see the change. (The fake client counts each object's
	// versions apart, so the shard's stays below the inventory's.)
	before := rvOf(stamped)
	if rvOf(s2) >= before {
		t.Fatalf("shard a-s2 at version %d, not below the inventory's %d", rvOf(s2), before)
	}
	s2.Spec.Packed = packed(t, shard("a-s2", "a", 2, "x2", "x4")).Spec.Packed
	if err := reader.Update(t.Context(), s2); err != nil {
		t.Fatal(err)
	}
	if rvOf(s2) >= before {
		t.Fatalf("shard a-s2 at version %d after its write, not below the inventory's %d", rvOf(s2), before)
	}
	check("after a shard older than the inventory changed", []string{"own", "x0", "x1", "x3", "x2", "x4"}, before+1)
	check("and again, nothing changed", []string{"own", "x0", "x1", "x3", "x2", "x4"}, before+1)
}

// packed moves sh's sandboxes into spec.packed, as vk-sandbox writes them.
func packed(t *testing.T, sh *v1beta1.NodeInventoryShard) *v1beta1.NodeInventoryShard {
	t.Helper()
	p, err := v1beta1.PackSandboxes(sh.Spec.Sandboxes)
	if err != nil {
		t.Fatal(err)
	}
	sh.Spec.Sandboxes, sh.Spec.Packed = nil, p
	return sh
}

// An inventory's spec.sandboxChanges apply on top of its shards: a
// changed entry replaces its shard's entry of the same ID or joins that
// shard in ID order, a removed ID leaves, an invalid entry is
// dropped; a shard written by a later fold than the changes' holds them
// already and is joined as it is. The joined inventory carries no changes,
// and a new version of the inventory is joined again.
func TestJoinChanges(t *testing.T) {
	const n = 4
	// idIn is an ID of name's that falls in shard k: name, then digits,
	// padded with z.
	idIn := func(k int, name string) string {
		for i := 0; ; i++ {
			id := fmt.Sprintf("%s%d", name, i)
			id += strings.Repeat("z", 20-len(id))
			if v1beta1.ShardOf(id, n) == k {
				return id
			}
		}
	}
	entry := func(id, meta string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxWarm, StartedAt: v1beta1.NewMicroTime(now), Metadata: map[string]string{"k": meta}}
	}
	a, b := []string{idIn(0, "a"), idIn(1, "a"), idIn(2, "a"), idIn(3, "a")}, []string{idIn(0, "b"), idIn(1, "b"), idIn(2, "b"), idIn(3, "b")}
	var objs []client.Object
	for k := range n {
		sh := &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.ShardName("h", k)},
			Spec: v1beta1.NodeInventoryShardSpec{Node: "h", Index: int32(k), Fold: 5,
				Sandboxes: []v1beta1.SandboxEntry{entry(a[k], "old"), entry(b[k], "old")}}}
		if k == 3 {
			sh.Spec.Fold = 9 // rewritten by a fold after the changes'
		}
		objs = append(objs, packed(t, sh))
	}
	bad := entry(idIn(1, "bad"), "new")
	bad.State = v1beta1.SandboxRunning // without a team: the schema would refuse it
	changed, err := v1beta1.PackSandboxes([]v1beta1.SandboxEntry{
		entry(a[0], "new"), entry(idIn(1, "c"), "new"), bad, entry(idIn(2, "0"), "new"), entry(idIn(3, "c"), "new"), entry(a[3], "new"),
	})
	if err != nil {
		t.Fatal(err)
	}
	inv := node("h", ago(0))
	inv.Spec.SandboxShards = n
	inv.Spec.SandboxChanges = &v1beta1.SandboxChanges{Fold: 5, Packed: changed, Removed: []string{b[2], b[3]}}
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(objs, inv)...).Build()
	src := New(reader, withClock(NewOptions()))
	check := func(step string, want []string) {
		t.Helper()
		one, err := src.NodeInventory(t.Context(), "h")
		if err != nil {
			t.Fatal(err)
		}
		all, err := src.ListNodesShared(t.Context())
		if err != nil || len(all) != 1 {
			t.Fatalf("ListNodesShared: %d, %v", len(all), err)
		}
		for _, got := range []*v1beta1.NodeInventory{one, &all[0]} {
			var entries []string
			for _, e := range got.Spec.Sandboxes {
				entries = append(entries, e.ID[:2]+"="+e.Metadata["k"])
			}
			if !slices.Equal(entries, want) {
				t.Errorf("%s: joined %v, want %v", step, entries, want)
			}
			if got.Spec.SandboxChanges != nil {
				t.Errorf("%s: the joined inventory still carries its changes", step)
			}
		}
	}
	short := func(id, meta string) string { return id[:2] + "=" + meta }
	check("changes on top of the shards", []string{
		short(a[0], "new"), short(b[0], "old"), // replaced in place
		short(a[1], "old"), short(b[1], "old"), short(idIn(1, "c"), "new"), // joined after; the invalid one dropped
		short(idIn(2, "0"), "new"), short(a[2], "old"), // merged in by ID; b[2] removed
		short(a[3], "old"), short(b[3], "old"), // shard 3 is newer than the changes: as it is
	})

	// The host folds: the inventory carries no changes, and the shards
	// are joined as they are.
	if err := reader.Get(t.Context(), client.ObjectKeyFromObject(inv), inv); err != nil {
		t.Fatal(err)
	}
	inv.Spec.SandboxChanges = nil
	if err := reader.Update(t.Context(), inv); err != nil {
		t.Fatal(err)
	}
	check("no changes", []string{
		short(a[0], "old"), short(b[0], "old"), short(a[1], "old"), short(b[1], "old"),
		short(a[2], "old"), short(b[2], "old"), short(a[3], "old"), short(b[3], "old"),
	})
}

// A shard whose entries are not sorted by ID (a host writes them sorted;
// a reader does not take its word for it) is joined sorted, each changed
// entry in place of the shard's and once.
func TestJoinChangesUnsortedShard(t *testing.T) {
	const n = 1
	id := func(p string) string { return p + strings.Repeat("z", 20-len(p)) }
	entry := func(id, meta string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxWarm, StartedAt: v1beta1.NewMicroTime(now), Metadata: map[string]string{"k": meta}}
	}
	sh := &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.ShardName("h", 0)},
		Spec: v1beta1.NodeInventoryShardSpec{Node: "h", Index: 0, Fold: 1,
			Sandboxes: []v1beta1.SandboxEntry{entry(id("d"), "old"), entry(id("b"), "old"), entry(id("a"), "old")}}}
	changed, err := v1beta1.PackSandboxes([]v1beta1.SandboxEntry{entry(id("c"), "new"), entry(id("b"), "new")})
	if err != nil {
		t.Fatal(err)
	}
	inv := node("h", ago(0))
	inv.Spec.SandboxShards = n
	inv.Spec.SandboxChanges = &v1beta1.SandboxChanges{Fold: 1, Packed: changed, Removed: []string{id("a")}}
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	src := New(fake.NewClientBuilder().WithScheme(scheme).WithObjects(packed(t, sh), inv).Build(), withClock(NewOptions()))
	got, err := src.NodeInventory(t.Context(), "h")
	if err != nil {
		t.Fatal(err)
	}
	var joined []string
	for _, e := range got.Spec.Sandboxes {
		joined = append(joined, e.ID[:1]+"="+e.Metadata["k"])
	}
	if want := []string{"b=new", "c=new", "d=old"}; !slices.Equal(joined, want) {
		t.Errorf("joined %v, want %v", joined, want)
	}
}

// A tracked Source reads a node's shards again only after a shard event
// of the node (or one whose node it cannot tell); without one it keeps
// the shards it joined, whatever the reader holds.
func TestJoinTracked(t *testing.T) {
	entry := func(id, meta string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: id + strings.Repeat("z", 20-len(id)), Template: "base", State: v1beta1.SandboxWarm, StartedAt: v1beta1.NewMicroTime(now), Metadata: map[string]string{"k": meta}}
	}
	shard := func(meta string) *v1beta1.NodeInventoryShard {
		return &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.ShardName("h", 0)},
			Spec: v1beta1.NodeInventoryShardSpec{Node: "h", Index: 0, Sandboxes: []v1beta1.SandboxEntry{entry("a", meta)}}}
	}
	inv := node("h", ago(0))
	inv.Spec.SandboxShards = 1
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(shard("v1"), inv).Build()
	src := New(reader, withClock(NewOptions()))
	src.TrackShardEvents()
	joined := func() string {
		t.Helper()
		all, err := src.ListNodesShared(t.Context())
		if err != nil || len(all) != 1 || len(all[0].Spec.Sandboxes) != 1 {
			t.Fatalf("ListNodesShared: %+v, %v", all, err)
		}
		return all[0].Spec.Sandboxes[0].Metadata["k"]
	}
	update := func(meta string) *v1beta1.NodeInventoryShard {
		t.Helper()
		sh := &v1beta1.NodeInventoryShard{}
		if err := reader.Get(t.Context(), client.ObjectKey{Name: v1beta1.ShardName("h", 0)}, sh); err != nil {
			t.Fatal(err)
		}
		sh.Spec.Sandboxes = []v1beta1.SandboxEntry{entry("a", meta)}
		if err := reader.Update(t.Context(), sh); err != nil {
			t.Fatal(err)
		}
		return sh
	}
	if got := joined(); got != "v1" {
		t.Fatalf("first join: %s, want v1", got)
	}
	sh := update("v2")
	if got := joined(); got != "v1" {
		t.Errorf("with no shard event: %s, want the shard joined before (v1)", got)
	}
	src.ShardEvent(sh)
	if got := joined(); got != "v2" {
		t.Errorf("after the shard's event: %s, want v2", got)
	}
	update("v3")
	src.ShardEvent(toolscache.DeletedFinalStateUnknown{Key: "unknown"})
	if got := joined(); got != "v3" {
		t.Errorf("after an event of no known node: %s, want v3", got)
	}
}

// After a fold the inventory carries no changes, and the shards hold them.
// The inventory and its shards reach a reader's cache through two
// watches, in no set order between them: a reader whose cache has the
// inventory that names the fold's shard writes
// (spec.shardsResourceVersion) but not yet the shards keeps the node's
// sandboxes as last joined, the shards and the changes before the fold,
// rather than lose the changes; once the shards arrive it joins them. It
// waits a publish interval on its own clock at the most (a shard deleted
// by someone else would hold the node back until its host's next shard
// write), then joins the shards it has.
func TestJoinWaitsForTheShardsTheInventoryNames(t *testing.T) {
	entry := func(id, meta string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: id + strings.Repeat("z", 20-len(id)), Template: "base", State: v1beta1.SandboxWarm, StartedAt: v1beta1.NewMicroTime(now), Metadata: map[string]string{"k": meta}}
	}
	sh := &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.ShardName("h", 0)},
		Spec: v1beta1.NodeInventoryShardSpec{Node: "h", Index: 0, Fold: 1, Sandboxes: []v1beta1.SandboxEntry{entry("a", "old")}}}
	changed, err := v1beta1.PackSandboxes([]v1beta1.SandboxEntry{entry("a", "new"), entry("b", "new")})
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(packed(t, sh)).Build()
	if err := reader.Get(t.Context(), client.ObjectKeyFromObject(sh), sh); err != nil {
		t.Fatal(err)
	}
	inv := node("h", ago(0))
	inv.Spec.SandboxShards = 1
	inv.Spec.ShardsResourceVersion = sh.ResourceVersion
	inv.Spec.SandboxChanges = &v1beta1.SandboxChanges{Fold: 1, Packed: changed}
	if err := reader.Create(t.Context(), inv); err != nil {
		t.Fatal(err)
	}
	// write changes the stored inventory.
	write := func(change func(*v1beta1.NodeInventory)) {
		t.Helper()
		if err := reader.Get(t.Context(), client.ObjectKeyFromObject(inv), inv); err != nil {
			t.Fatal(err)
		}
		change(inv)
		if err := reader.Update(t.Context(), inv); err != nil {
			t.Fatal(err)
		}
	}
	// aheadOfTheShard names a shard write after sh's, and no changes: a
	// fold's inventory, before its shard.
	aheadOfTheShard := func(inv *v1beta1.NodeInventory) {
		rv, _ := strconv.ParseUint(sh.ResourceVersion, 10, 64)
		inv.Spec.ShardsResourceVersion = strconv.FormatUint(rv+1, 10)
		inv.Spec.SandboxChanges = nil
	}
	for _, tracked := range []bool{false, true} {
		opts := withClock(NewOptions())
		local := clocktesting.NewFakePassiveClock(now)
		opts.Local, opts.PublishInterval = local, 30*time.Second
		src := New(reader, opts)
		if tracked {
			src.TrackShardEvents()
		}
		joined := func(step string, want ...string) {
			t.Helper()
			all, err := src.ListNodesShared(t.Context())
			if err != nil || len(all) != 1 {
				t.Fatalf("%s: ListNodesShared: %+v, %v", step, all, err)
			}
			var got []string
			for _, e := range all[0].Spec.Sandboxes {
				got = append(got, e.ID[:1]+"="+e.Metadata["k"])
			}
			if !slices.Equal(got, want) {
				t.Errorf("tracked %v, %s: joined %v, want %v", tracked, step, got, want)
			}
		}
		joined("changes carried", "a=new", "b=new")

		// The host folds: its shard, then its inventory, which now names
		// that write and carries nothing. The cache has the inventory
		// first.
		write(aheadOfTheShard)
		joined("the fold's inventory before its shard", "a=new", "b=new")
		local.SetTime(now.Add(29 * time.Second))
		joined("the fold's inventory 29 s before its shard", "a=new", "b=new")
		local.SetTime(now.Add(30 * time.Second))
		joined("a publish interval without the fold's shard", "a=old")
		joined("and after", "a=old")
		// A change the host carries next is joined at once: the reader
		// does not wait for that shard write again.
		later, err := v1beta1.PackSandboxes([]v1beta1.SandboxEntry{entry("d", "new")})
		if err != nil {
			t.Fatal(err)
		}
		write(func(inv *v1beta1.NodeInventory) {
			inv.Spec.SandboxChanges = &v1beta1.SandboxChanges{Fold: 2, Packed: later}
		})
		joined("a change carried after the wait", "a=old", "d=new")
		write(func(inv *v1beta1.NodeInventory) { inv.Spec.SandboxChanges = nil })

		// The shard arrives.
		folded := sh.DeepCopy()
		folded.Spec.Fold = 2
		folded.Spec.Sandboxes = []v1beta1.SandboxEntry{entry("a", "new"), entry("b", "new"), entry("c", "folded")}
		if err := reader.Update(t.Context(), packed(t, folded)); err != nil {
			t.Fatal(err)
		}
		if folded.ResourceVersion != inv.Spec.ShardsResourceVersion {
			t.Fatalf("the shard's write is at %s, the inventory names %s", folded.ResourceVersion, inv.Spec.ShardsResourceVersion)
		}
		src.ShardEvent(folded)
		joined("the fold's shard arrived", "a=new", "b=new", "c=folded")

		// Back to the start for the other Source.
		sh.ResourceVersion = folded.ResourceVersion
		sh.Spec.Sandboxes, sh.Spec.Packed = []v1beta1.SandboxEntry{entry("a", "old")}, ""
		if err := reader.Update(t.Context(), packed(t, sh)); err != nil {
			t.Fatal(err)
		}
		write(func(inv *v1beta1.NodeInventory) {
			inv.Spec.ShardsResourceVersion = sh.ResourceVersion
			inv.Spec.SandboxChanges = &v1beta1.SandboxChanges{Fold: 1, Packed: changed}
		})
	}

	// A reader that has joined nothing of the node yet joins what it has.
	write(aheadOfTheShard)
	fresh := New(reader, withClock(NewOptions()))
	got, err := fresh.NodeInventory(t.Context(), "h")
	if err != nil || len(got.Spec.Sandboxes) != 1 || got.Spec.Sandboxes[0].Metadata["k"] != "old" {
		t.Errorf("a first join ahead of its shards: %+v, %v; want the shard as it is", got, err)
	}
}
