package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func inv(name, endpoint string, ids ...string) *v1beta1.NodeInventory {
	n := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.NodeInventorySpec{Endpoint: endpoint}}
	for _, id := range ids {
		n.Spec.Sandboxes = append(n.Spec.Sandboxes, v1beta1.SandboxEntry{ID: id})
	}
	return n
}

func newID(t testing.TB, node string) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(node))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// collidingNames returns two node names with the same tag.
func collidingNames(t testing.TB) (string, string) {
	t.Helper()
	seen := map[sandboxid.Tag]string{}
	for i := 0; ; i++ {
		name := fmt.Sprintf("node-%d", i)
		tag := sandboxid.NodeTag(name)
		if other, ok := seen[tag]; ok {
			return other, name
		}
		seen[tag] = name
		if i > 10_000_000 {
			t.Fatal("no two names share a tag")
		}
	}
}

func TestLookup(t *testing.T) {
	a, b := collidingNames(t) // same tag
	idA, idB, idUnlisted := newID(t, a), newID(t, b), newID(t, a)
	idC := newID(t, "node-c")
	src := inventory.NewStaticSource(
		inv(b, "10.0.0.2:27777", idB),
		inv(a, "10.0.0.1:27777", "zzzzzzzzzzzzzzzz"+string(sandboxid.NodeTag(a)), idA), // unsorted: newNode sorts
		inv("node-c", "10.0.0.3:27777"),
	)
	x := New(src, Options{})
	if x.Synced() {
		t.Fatal("synced before any rebuild")
	}
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := a
	if b < a {
		first = b
	}
	for _, tc := range []struct {
		id   string
		want string // node name; "" for none
	}{
		{idA, a},            // listed on a
		{idB, b},            // listed on b, which shares a's tag
		{idUnlisted, first}, // on neither yet: the first by name
		{idC, "node-c"},     // one node with the tag: listed or not
		{newID(t, "node-gone"), ""},
		{"abc", ""},                  // not a sandbox ID
		{idA + "0", ""},              // too long
		{"K3X9Q2M7V1P8Z0C4T7FA", ""}, // not [a-z0-9]
	} {
		got, ok := x.Lookup(tc.id)
		if ok != (tc.want != "") || got.Name != tc.want {
			t.Errorf("Lookup(%s) = %+v, %v; want %q", tc.id, got, ok, tc.want)
		}
	}
	if n, _ := x.Lookup(idA); n.Endpoint != "10.0.0.1:27777" {
		t.Errorf("endpoint of %s = %q", a, n.Endpoint)
	}
	if !x.Synced() || x.Nodes() != 3 || !x.Seen("10.0.0.3:27777") || x.Seen("10.0.0.9:27777") {
		t.Errorf("Synced=%v Nodes=%d", x.Synced(), x.Nodes())
	}

	// A node that leaves the source leaves the index at the next rebuild.
	src.Remove("node-c")
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, ok := x.Lookup(idC); ok {
		t.Errorf("Lookup after node-c left = %+v", n)
	}
	if !x.Seen("10.0.0.3:27777") {
		t.Error("Seen forgot an endpoint")
	}
}

// An inventory that lists other nodes' sandboxes (inventory.Owned) gets none
// of their traffic and the index does not hold them; the node's own still
// route. (Lookup only ever asks nodes with the ID's tag, so this held before
// the index dropped foreign entries too; the index now holds only what it
// can route, and says which node lied.)
func TestLookupIgnoresOtherNodesSandboxes(t *testing.T) {
	idA, idB, idGone := newID(t, "node-a"), newID(t, "node-b"), newID(t, "node-gone")
	var logs strings.Builder
	src := inventory.NewStaticSource(
		inv("node-a", "10.0.0.1:27777", idB, idA, idGone),
		inv("node-b", "10.0.0.2:27777", idB),
	)
	x := New(src, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{{idA, "node-a"}, {idB, "node-b"}, {idGone, ""}} {
		if got, ok := x.Lookup(tc.id); ok != (tc.want != "") || got.Name != tc.want {
			t.Errorf("Lookup(%s) = %+v, %v; want %q", tc.id, got, ok, tc.want)
		}
	}
	if ids := x.snap.Load().byName["node-a"].ids; !slices.Equal(ids, []string{idA}) {
		t.Errorf("node-a's IDs in the index = %q, want only its own", ids)
	}
	if !strings.Contains(logs.String(), "node inventory lists sandboxes of other nodes") || !strings.Contains(logs.String(), "node=node-a sandboxes=2") {
		t.Errorf("log: %s", logs.String())
	}
	// node-b gone, its sandbox still on node-a's list: no route at all.
	src.Remove("node-b")
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, ok := x.Lookup(idB); ok {
		t.Errorf("node-b's sandbox routes to %+v once node-b left", got)
	}
}

// A stale node, as kubeinventory's filter decides it, leaves the index.
func TestLookupFollowsFreshness(t *testing.T) {
	now := time.Now()
	stamp := func(n *v1beta1.NodeInventory, at time.Time) *v1beta1.NodeInventory {
		ts := metav1.NewTime(at)
		n.PublishedAt = &ts
		return n
	}
	idLive, idDead := newID(t, "live"), newID(t, "dead")
	reader := &listReader{items: []v1beta1.NodeInventory{
		*stamp(inv("live", "10.0.0.1:27777", idLive), now),
		*stamp(inv("dead", "10.0.0.2:27777", idDead), now.Add(-10*time.Second)),
	}}
	opts := kubeinventory.NewOptions()
	opts.StaleAfter = 10 * time.Second
	x := New(kubeinventory.New(reader, opts), Options{})
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok := x.Lookup(idDead); !ok {
		t.Fatal("a node exactly the window behind should route")
	}
	reader.set(0, *stamp(inv("live", "10.0.0.1:27777", idLive), now.Add(time.Second)))
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, ok := x.Lookup(idDead); ok {
		t.Fatalf("a stale node routes: %+v", n)
	}
	if _, ok := x.Lookup(idLive); !ok {
		t.Fatal("the live node left")
	}
}

// A failed rebuild keeps the last snapshot and is reported.
func TestRefreshErrorKeepsSnapshot(t *testing.T) {
	id := newID(t, "n1")
	reader := &listReader{items: []v1beta1.NodeInventory{*inv("n1", "10.0.0.1:27777", id)}}
	var reports []error
	x := New(kubeinventory.New(reader, kubeinventory.NewOptions()), Options{
		OnRefresh: func(_ time.Duration, _ int, err error) { reports = append(reports, err) },
	})
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	reader.fail(errors.New("apiserver away"))
	if err := x.Refresh(t.Context()); err == nil {
		t.Fatal("Refresh hid the source's error")
	}
	if _, ok := x.Lookup(id); !ok {
		t.Fatal("a failed rebuild dropped the fleet")
	}
	if len(reports) != 2 || reports[0] != nil || reports[1] == nil {
		t.Fatalf("OnRefresh got %v", reports)
	}
}

// Rebuilds reuse a node's IDs when its inventory did not change, and see
// a new sandbox list when it did.
func TestRebuildReusesUnchangedNodes(t *testing.T) {
	a, b := collidingNames(t)
	id1, id2 := newID(t, a), newID(t, a)
	src := inventory.NewStaticSource(inv(a, "10.0.0.1:1", id1), inv(b, "10.0.0.2:1"))
	x := New(src, Options{})
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := x.snap.Load().byName[a]
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if x.snap.Load().byName[a] != before {
		t.Error("an unchanged node was rebuilt")
	}
	src.Apply(inv(a, "10.0.0.1:1", id1, id2))
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, _ := x.Lookup(id2); n.Name != a {
		t.Errorf("a sandbox added to %s routes to %q", a, n.Name)
	}
	src.Apply(inv(a, "10.0.0.9:1", id1, id2))
	if err := x.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, _ := x.Lookup(id1); n.Endpoint != "10.0.0.9:1" {
		t.Errorf("a moved endpoint is not followed: %+v", n)
	}
}

// Run rebuilds on Poke, long before the refresh interval.
func TestRunRebuildsOnPoke(t *testing.T) {
	src := inventory.NewStaticSource()
	x := New(src, Options{RefreshInterval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { _ = x.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	id := newID(t, "n1")
	src.Apply(inv("n1", "10.0.0.1:1", id))
	for {
		x.Poke()
		if _, ok := x.Lookup(id); ok {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("a poke never rebuilt the index")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// listReader is a controller-runtime reader over a fixed list, for the
// freshness filter's pure logic.
type listReader struct {
	mu    sync.Mutex
	items []v1beta1.NodeInventory
	err   error
}

func (r *listReader) set(i int, n v1beta1.NodeInventory) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items[i] = n
}

func (r *listReader) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *listReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	l := list.(*v1beta1.NodeInventoryList)
	l.Items = nil
	for i := range r.items {
		l.Items = append(l.Items, *r.items[i].DeepCopy())
	}
	return nil
}

func (r *listReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.items {
		if r.items[i].Name == key.Name {
			r.items[i].DeepCopyInto(obj.(*v1beta1.NodeInventory))
			return nil
		}
	}
	return inventory.NotFound(key.Name)
}

// OnGone hears of the nodes a rebuild drops (gone from the source, or at
// another endpoint now) once they have stayed out for GoneAfter; not of
// those that stay, nor of one back in time (a sandboxd's restart).
func TestOnGone(t *testing.T) {
	src := inventory.NewStaticSource()
	src.Apply(inv("node-a", "10.0.0.1:9000"))
	src.Apply(inv("node-b", "10.0.0.2:9000"))
	src.Apply(inv("node-c", "10.0.0.3:9000"))
	src.Apply(inv("node-d", "10.0.0.4:9000"))
	const grace = 300 * time.Millisecond
	x := New(src, Options{GoneAfter: grace})
	var got []Node
	x.OnGone(func(ns []Node) { got = append(got, ns...) })
	refresh := func() {
		t.Helper()
		if err := x.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	refresh()
	src.Remove("node-a")
	src.Apply(inv("node-b", "10.0.0.9:9000"))
	src.Remove("node-d")
	refresh()
	if len(got) != 0 {
		t.Fatalf("told of %v at once, with a grace of %s", got, grace)
	}
	src.Apply(inv("node-d", "10.0.0.4:9000")) // back in time
	refresh()
	time.Sleep(grace)
	refresh()
	slices.SortFunc(got, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	want := []Node{{Name: "node-a", Endpoint: "10.0.0.1:9000"}, {Name: "node-b", Endpoint: "10.0.0.2:9000"}}
	if !slices.Equal(got, want) {
		t.Fatalf("told of %v after the grace, want %v", got, want)
	}
	got = nil
	refresh()
	if len(got) != 0 {
		t.Fatalf("told again of %v", got)
	}
}
