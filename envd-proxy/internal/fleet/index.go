// Package fleet is the proxy's view of where sandboxes run: an index from
// the node tag in a sandbox ID (shared/sandboxid) to the fresh nodes with
// that tag, rebuilt from the fleet's freshness-filtered inventory source.
//
// A request looks up its sandbox in the last snapshot, one map read and a
// binary search, without touching the source: listing a fleet of 2,000
// sandboxes per node for every request would cost far more than the
// request. The snapshot is rebuilt whenever Poke is called (in Kubernetes
// mode, on every NodeInventory event of the informer) and every refresh
// interval, so a node that goes stale leaves routing within one refresh of
// the event that made it stale.
package fleet

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// Lister lists the fresh inventories: inventory.Source's ListNodes, which
// drops stale nodes. The index only reads what it returns, so a source over
// an informer cache may hand out the cache's own objects.
type Lister interface {
	ListNodes(ctx context.Context) ([]v1beta1.NodeInventory, error)
}

// ListerFunc is a Lister of a function, such as a source's
// ListNodesShared.
type ListerFunc func(ctx context.Context) ([]v1beta1.NodeInventory, error)

// ListNodes calls f.
func (f ListerFunc) ListNodes(ctx context.Context) ([]v1beta1.NodeInventory, error) { return f(ctx) }

// Node is where a sandbox's traffic goes.
type Node struct {
	// Name is the node's (and its NodeInventory's) name.
	Name string
	// Endpoint is its sandboxd's host:port.
	Endpoint string
}

// Options tune an Index.
type Options struct {
	// RefreshInterval is how often the index is rebuilt without a Poke.
	// Default 500 ms.
	RefreshInterval time.Duration
	// OnRefresh, if set, is told how each rebuild went (for metrics).
	OnRefresh func(took time.Duration, nodes int, err error)
	// GoneAfter is how long a node the index dropped must stay gone (not
	// back at the same endpoint) before OnGone hears of it; 0: at once.
	GoneAfter time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultRefreshInterval is the default of Options.RefreshInterval.
const DefaultRefreshInterval = 500 * time.Millisecond

// Index maps sandbox IDs to fresh nodes. Run keeps it current; Lookup reads
// it. It is safe for concurrent use.
type Index struct {
	src  Lister
	opts Options
	log  *slog.Logger
	snap atomic.Pointer[snapshot]
	poke chan struct{}

	synced atomic.Bool
	mu     sync.Mutex          // guards seen
	seen   map[string]struct{} // every endpoint ever in a snapshot
	gone   atomic.Pointer[func([]Node)]

	absentMu sync.Mutex
	// absent are the nodes dropped and not back (by name and endpoint),
	// with when they were dropped; guarded by absentMu.
	absent map[Node]time.Time
}

// OnGone sets f to be told of the nodes the index dropped (gone from the
// fleet, stale, or at another endpoint now) once they have stayed so for
// Options.GoneAfter. It runs on a rebuild's goroutine, once that rebuild's
// snapshot is in place.
func (x *Index) OnGone(f func([]Node)) { x.gone.Store(&f) }

// goneFor records which nodes next dropped of prev and which came back,
// and returns those gone for GoneAfter as of now.
func (x *Index) goneFor(prev, next *snapshot, now time.Time) []Node {
	x.absentMu.Lock()
	defer x.absentMu.Unlock()
	for name, n := range prev.byName {
		if m, ok := next.byName[name]; !ok || m.Endpoint != n.Endpoint {
			if _, known := x.absent[n.Node]; !known {
				x.absent[n.Node] = now
			}
		}
	}
	var gone []Node
	for n, since := range x.absent {
		switch m, ok := next.byName[n.Name]; {
		case ok && m.Endpoint == n.Endpoint:
			delete(x.absent, n) // back
		case now.Sub(since) >= x.opts.GoneAfter:
			gone = append(gone, n)
			delete(x.absent, n)
		}
	}
	return gone
}

// snapshot is one rebuild's view of the fleet.
type snapshot struct {
	byTag  map[sandboxid.Tag][]*node
	byName map[string]*node
}

// node is one fresh node and the sandboxes its inventory lists.
type node struct {
	Node
	tag             sandboxid.Tag
	resourceVersion string
	ids             []string // sorted
}

// New returns an empty index over src; Run fills it.
func New(src Lister, opts Options) *Index {
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = DefaultRefreshInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	x := &Index{src: src, opts: opts, log: opts.Logger, poke: make(chan struct{}, 1), seen: map[string]struct{}{}, absent: map[Node]time.Time{}}
	x.snap.Store(&snapshot{})
	return x
}

// Lookup returns the node that runs the sandbox id: among the fresh nodes
// whose tag ends the ID, the one whose inventory lists the ID, else the
// first by name (a sandbox younger than its node's last publish is not
// listed yet). It reports false for an ID that is not a sandbox ID, and for
// one whose tag no fresh node has.
func (x *Index) Lookup(id string) (Node, bool) {
	tag, err := sandboxid.Parse(id)
	if err != nil {
		return Node{}, false
	}
	cands := x.snap.Load().byTag[tag]
	switch len(cands) {
	case 0:
		return Node{}, false
	case 1:
		return cands[0].Node, true
	}
	for _, n := range cands {
		if _, found := slices.BinarySearch(n.ids, id); found {
			return n.Node, true
		}
	}
	return cands[0].Node, true
}

// Nodes returns how many fresh nodes the last snapshot holds.
func (x *Index) Nodes() int { return len(x.snap.Load().byName) }

// Synced reports whether a rebuild has succeeded; once true, it stays true.
func (x *Index) Synced() bool { return x.synced.Load() }

// Seen reports whether a node with endpoint has been in any snapshot.
func (x *Index) Seen(endpoint string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.seen[endpoint]
	return ok
}

// Poke asks for a rebuild soon; pokes before it runs coalesce into one. It
// never blocks, so an informer's event handler may call it.
func (x *Index) Poke() {
	select {
	case x.poke <- struct{}{}:
	default:
	}
}

// Run rebuilds the index at once, then on every Poke and every refresh
// interval, until ctx ends. A failed rebuild keeps the last snapshot (the
// source's own filter keeps dropping stale nodes on the next one). It
// returns ctx's error.
func (x *Index) Run(ctx context.Context) error {
	t := time.NewTicker(x.opts.RefreshInterval)
	defer t.Stop()
	for {
		if err := x.Refresh(ctx); err != nil && ctx.Err() == nil {
			x.log.WarnContext(ctx, "rebuild the routing index", "error", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-x.poke:
		}
	}
}

// Refresh rebuilds the index from the source once.
func (x *Index) Refresh(ctx context.Context) error {
	start := time.Now()
	invs, err := x.src.ListNodes(ctx)
	if err != nil {
		if x.opts.OnRefresh != nil {
			x.opts.OnRefresh(time.Since(start), len(x.snap.Load().byName), err)
		}
		return err
	}
	prev := x.snap.Load()
	next, foreign := build(prev, invs)
	x.snap.Store(next)
	if gone := x.goneFor(prev, next, time.Now()); len(gone) > 0 {
		if f := x.gone.Load(); f != nil {
			(*f)(gone)
		}
	}
	for _, f := range foreign {
		x.log.WarnContext(ctx, "node inventory lists sandboxes of other nodes; they are not routed to it", "node", f.node, "sandboxes", f.count)
	}
	x.see(next)
	x.synced.Store(true)
	if x.opts.OnRefresh != nil {
		x.opts.OnRefresh(time.Since(start), len(next.byName), nil)
	}
	return nil
}

func (x *Index) see(s *snapshot) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, n := range s.byName {
		x.seen[n.Endpoint] = struct{}{}
	}
}

// foreignEntries counts the entries of a node's inventory that name other
// nodes' sandboxes (see inventory.Owned), which the index leaves out.
type foreignEntries struct {
	node  string
	count int
}

// build makes a snapshot of invs, reusing prev's node where the inventory
// did not change (same resourceVersion, endpoint and sandbox IDs), so a
// rebuild on every publish of a big fleet copies almost nothing. A node's
// IDs are those its inventory can own (inventory.Owned); foreign counts,
// for each node built anew, the entries left out.
func build(prev *snapshot, invs []v1beta1.NodeInventory) (s *snapshot, foreign []foreignEntries) {
	s = &snapshot{
		byTag:  make(map[sandboxid.Tag][]*node, len(invs)),
		byName: make(map[string]*node, len(invs)),
	}
	for i := range invs {
		inv := &invs[i]
		n := prev.byName[inv.Name]
		fresh := func(owned []v1beta1.SandboxEntry) *node {
			if d := len(inv.Spec.Sandboxes) - len(owned); d > 0 {
				foreign = append(foreign, foreignEntries{node: inv.Name, count: d})
			}
			return newNode(inv, owned)
		}
		switch {
		case n == nil || n.Endpoint != inv.Spec.Endpoint:
			n = fresh(inventory.Owned(inv))
		case inv.ResourceVersion != "" && inv.ResourceVersion == n.resourceVersion:
			// The very object of the last rebuild.
		default:
			owned := inventory.Owned(inv)
			if !sameIDs(n.ids, owned) {
				n = fresh(owned)
				break
			}
			if n.resourceVersion != inv.ResourceVersion {
				c := *n // a new publish of the same sandboxes: share the IDs
				c.resourceVersion = inv.ResourceVersion
				n = &c
			}
		}
		s.byName[n.Name] = n
		s.byTag[n.tag] = append(s.byTag[n.tag], n)
	}
	for _, cands := range s.byTag {
		if len(cands) > 1 {
			slices.SortFunc(cands, func(a, b *node) int { return strings.Compare(a.Name, b.Name) })
		}
	}
	return s, foreign
}

// newNode is inv's node, listing the sandboxes owned (inventory.Owned(inv)).
func newNode(inv *v1beta1.NodeInventory, owned []v1beta1.SandboxEntry) *node {
	ids := make([]string, len(owned))
	for i := range owned {
		ids[i] = owned[i].ID
	}
	if !slices.IsSorted(ids) {
		slices.Sort(ids)
	}
	return &node{
		Node:            Node{Name: inv.Name, Endpoint: inv.Spec.Endpoint},
		tag:             sandboxid.NodeTag(inv.Name),
		resourceVersion: inv.ResourceVersion,
		ids:             ids,
	}
}

// sameIDs reports whether sandboxes lists exactly ids, in ids' (sorted)
// order; an inventory listed in another order counts as changed.
func sameIDs(ids []string, sandboxes []v1beta1.SandboxEntry) bool {
	if len(ids) != len(sandboxes) {
		return false
	}
	for i := range ids {
		if ids[i] != sandboxes[i].ID {
			return false
		}
	}
	return true
}
