// Package kubeinventory is the fleet as the apiserver and the envd proxy see
// it: the NodeInventory objects that each host's vk-sandbox publishes, read
// from Kubernetes (an informer cache in production) through a freshness
// filter.
//
// The filter compares stamps with each other, not with the reader's clock.
// Every list computes reference = min(newest publishedAt, now) and drops an
// inventory whose publishedAt trails the reference by more than StaleAfter.
// So a dead host leaves once live hosts have published past the window, while
// a control-plane outage (every stamp frozen together), a publisher clock
// that runs ahead (capped by now) or a fleet whose hosts all stop at once
// empties nothing. Lookups by name compare against the reference the last
// list stored. A missing or unreadable stamp, and any lookup before the first
// list, count as fresh.
//
// A reference that jumps by more than StaleAfter from one list to the next
// means nothing was published, or seen, for longer than the window: a write
// outage of the control plane, or this reader cut off from it. The first
// host to publish afterwards would make every other host stale at once,
// though they are as alive as it is. So the jump starts a recovery: a node
// that was fresh against the reference before the jump keeps its place for
// one PublishInterval, by when every live host has published again (a host
// whose writes failed tries again within an interval), and a dead one then
// leaves. The recovery ends at whichever comes first: the reference
// PublishInterval past the jump, or PublishInterval on the reader's own
// clock since it saw the jump. The second is a duration the reader measures
// itself, not a comparison of its clock with the publishers'; it keeps a
// live host's publishes after a change (which restart its interval) from
// holding a dead host longer than one interval. Readers
// observe every inventory event (Observe), so that the reference follows
// each publish and an idle reader does not take its own silence for an
// outage.
//
// A host whose sandboxes are in NodeInventoryShards (spec.sandboxShards)
// has them joined here into its spec.sandboxes, for the fresh inventories
// only: a stale host's shards leave with it. The joined inventory's
// resourceVersion is the newest of its own and its shards', so that a
// reader that skips an unchanged node by its resourceVersion sees a change
// to any shard. A Source told of every shard event (TrackShardEvents, as
// package fleetsource wires the servers') reads the shards only of the
// nodes with a shard event since their last join. An inventory that names
// a shard write newer than every shard of its node this reader has
// (spec.shardsResourceVersion: the shards' watch is behind the
// inventories') leaves the node as last joined until the shards arrive,
// for one PublishInterval on the reader's own clock at the most.
package kubeinventory

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// Candidate is a warm sandbox that a create may claim.
type Candidate = inventory.Candidate

// Source reads NodeInventory objects through the freshness filter. It is safe
// for concurrent use.
type Source struct {
	reader     client.Reader
	staleAfter time.Duration
	// clock caps the reference; local measures the recovery's end.
	clock, local clock.PassiveClock
	grace        time.Duration
	// ref is what the last list computed; nil before the first.
	ref atomic.Pointer[reference]

	mu sync.Mutex
	// joins are the sharded nodes' joined sandboxes, by node name.
	joins map[string]*joined
	// With tracked (TrackShardEvents), shardGens holds, by node, the
	// event counter at the node's last shard event, and epoch the counter
	// at the last event whose node was not known: a join whose node's
	// stamp (shardStamp) did not move since it was built reads no shard.
	tracked   bool
	events    uint64
	epoch     uint64
	shardGens map[string]uint64
}

// joined is one node's sandboxes joined from its shards, kept while the
// shards are the same objects: the join is then free.
type joined struct {
	// rvs are the resourceVersions of the shards joined, by index (""
	// for a shard missing).
	rvs []string
	// rv is the newest of them, as a number.
	rv uint64
	// sandboxes are the shards' entries in shard order, with the
	// inventory's changes applied, sharing memory with the cached shards:
	// only read.
	sandboxes []v1beta1.SandboxEntry
	// parts are each shard's entries (by index), so that the next join
	// decodes only the shards that changed.
	parts [][]v1beta1.SandboxEntry
	// sorted says, by index, whether a part's entries are sorted by ID.
	sorted []bool
	// changes is the resourceVersion of the inventory whose
	// spec.sandboxChanges are applied in sandboxes; "": none.
	changes string
	// decoder decodes the changes, keeping their entries for the next
	// version's (passed on from one joined to the next).
	decoder *packedDecoder
	// returned is the newest resourceVersion a join of these sandboxes
	// gave the node (under Source.mu): a join that builds them again
	// gives a newer one.
	returned uint64
	// shards are the shards joined (by index; nil: missing or ignored),
	// for the folds of a later version's changes; stamp is the node's
	// shard stamp they were read at (under Source.mu), for a tracked
	// Source.
	shards []*v1beta1.NodeInventoryShard
	stamp  uint64
	// waitFor is the shard write (spec.shardsResourceVersion) this join
	// is kept for, since waitSince on the reader's clock; gaveUp, the
	// newest such write a join stopped waiting for (under Source.mu).
	waitFor, gaveUp uint64
	waitSince       time.Time
}

// reference is what a list computed: the reference and, during a recovery,
// the reference before the jump and where the recovery ends.
type reference struct {
	// at is min(newest publishedAt, now) in unix nanoseconds; zero after a
	// list that saw no readable stamp.
	at int64
	// before and until are set during a recovery (unix nanoseconds): nodes
	// fresh against before stay fresh while the reference is short of until
	// and the reader's clock short of deadline.
	before, until int64
	// deadline is the reader's clock one PublishInterval after it saw the
	// jump (with its monotonic reading, so a step of the wall clock does not
	// move it).
	deadline time.Time
}

// recovering reports whether the recovery ref carries is still on at now.
func (r reference) recovering(now time.Time) bool {
	return r.until != 0 && r.at < r.until && now.Before(r.deadline)
}

// Reference is the filter's reference as the last list or Observe
// computed it: the newest publishedAt of the fleet this reader has seen,
// capped by its clock; false before any, or with no readable stamp. Now
// minus it is how far behind this reader's view of the fleet is (a
// publish interval, normally).
func (s *Source) Reference() (time.Time, bool) {
	r := s.reference()
	if r.at == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, r.at), true
}

// reference returns the last computed reference (zero: none).
func (s *Source) reference() reference {
	if r := s.ref.Load(); r != nil {
		return *r
	}
	return reference{}
}

var _ inventory.Source = (*Source)(nil)

// New returns a Source that reads through reader, an informer-backed cache in
// production. A zero StaleAfter means DefaultStaleAfter.
func New(reader client.Reader, opts Options) *Source {
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = DefaultStaleAfter
	}
	if opts.PublishInterval <= 0 {
		opts.PublishInterval = opts.StaleAfter / 3
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Local == nil {
		opts.Local = opts.Clock
		if _, corrects := opts.Clock.(interface{ Corrections() uint64 }); corrects {
			// Its corrections would move the recovery's end.
			opts.Local = clock.RealClock{}
		}
	}
	return &Source{reader: reader, staleAfter: opts.StaleAfter, grace: opts.PublishInterval, clock: opts.Clock, local: opts.Local, joins: map[string]*joined{}, shardGens: map[string]uint64{}}
}

// TrackShardEvents tells the Source that its reader is an informer cache
// whose every NodeInventoryShard event reaches ShardEvent before anything
// that reads the Source acts on that event (ShardEventHandler), so that a
// join reads the shards only of the nodes that had a shard event since
// their last join. A list then costs the nodes that changed, not a copy
// of every shard of the fleet (3,200 at 200 hosts) on every refresh.
// Without it, every join looks at every shard of its node. Call it before
// the first read.
func (s *Source) TrackShardEvents() {
	s.mu.Lock()
	s.tracked = true
	s.mu.Unlock()
}

// ShardEvent records an event of a NodeInventoryShard: obj is the shard,
// or the tombstone of a deleted one. Anything else counts as an event of
// every node.
func (s *Source) ShardEvent(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events++
	sh, ok := obj.(*v1beta1.NodeInventoryShard)
	if !ok || sh == nil {
		s.epoch = s.events
		return
	}
	// The node its name says and the node it says: a join ignores a
	// shard whose spec does not match its name, so either may have
	// changed.
	s.shardGens[sh.Spec.Node] = s.events
	if node, ok := v1beta1.ShardNode(sh.Name); ok {
		s.shardGens[node] = s.events
	}
}

// ShardEventHandler calls ShardEvent on every NodeInventoryShard event,
// then then (if not nil): a reader that acts on shard events registers
// its action through it, so that the Source knows of the event before the
// action reads it.
func (s *Source) ShardEventHandler(then func()) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			s.ShardEvent(obj)
			if then != nil {
				then()
			}
		},
		UpdateFunc: func(old, obj any) {
			s.ShardEvent(old)
			s.ShardEvent(obj)
			if then != nil {
				then()
			}
		},
		DeleteFunc: func(obj any) {
			s.ShardEvent(obj)
			if then != nil {
				then()
			}
		},
	}
}

// shardStamp is node's shard stamp (under mu): it moves on every event of
// one of the node's shards.
func (s *Source) shardStamp(node string) uint64 { return max(s.shardGens[node], s.epoch) }

// getShard is a lookup of one shard in the reader: a shallow copy of the
// cached object, only read; nil when there is none.
func (s *Source) getShard(ctx context.Context) func(name string) (*v1beta1.NodeInventoryShard, error) {
	return func(name string) (*v1beta1.NodeInventoryShard, error) {
		sh := &v1beta1.NodeInventoryShard{}
		err := s.reader.Get(ctx, client.ObjectKey{Name: name}, sh, client.UnsafeDisableDeepCopy)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return sh, err
	}
}

// Observe advances the reference from the inventories as they are now,
// without copying them: the readers call it on every NodeInventory event
// (fleetsource does), so that the reference follows every publish whether
// or not anything lists, and only a real silence of the fleet reads as a
// jump.
func (s *Source) Observe(ctx context.Context) error {
	var list v1beta1.NodeInventoryList
	// Shallow copies of the cached objects, only read.
	if err := s.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list node inventories: %w", err)
	}
	s.advance(list.Items)
	return nil
}

// ListNodes returns every fresh inventory (deep copies the caller owns) and
// advances the reference that lookups compare against.
func (s *Source) ListNodes(ctx context.Context) ([]v1beta1.NodeInventory, error) {
	var list v1beta1.NodeInventoryList
	if err := s.reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list node inventories: %w", err)
	}
	nodes := s.fresh(list.Items)
	if err := s.joinAll(ctx, nodes, true); err != nil {
		return nil, err
	}
	return nodes, nil
}

// ListNodesShared is ListNodes without copies: the fresh inventories are
// shallow copies of the cache's objects, their shards' entries joined
// without copying them, for callers that only read (inventory.Source).
func (s *Source) ListNodesShared(ctx context.Context) ([]v1beta1.NodeInventory, error) {
	var list v1beta1.NodeInventoryList
	if err := s.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list node inventories: %w", err)
	}
	nodes := s.fresh(list.Items)
	if err := s.joinAll(ctx, nodes, false); err != nil {
		return nil, err
	}
	return nodes, nil
}

// NodeInventory returns one fresh inventory, a deep copy the caller owns. An
// absent or stale node is a NotFound for nodeinventories.skiff.dev.
func (s *Source) NodeInventory(ctx context.Context, name string) (*v1beta1.NodeInventory, error) {
	inv := &v1beta1.NodeInventory{}
	if err := s.get(ctx, name, inv); err != nil {
		return nil, err
	}
	if inv.Spec.SandboxShards > 0 {
		if err := s.join(inv, s.getShard(ctx), true); err != nil {
			return nil, fmt.Errorf("get the shards of node inventory %s: %w", name, err)
		}
	}
	return inv, nil
}

// NodeCapacity returns what one fresh node can hold in all, without copying
// its inventory. An absent or stale node is a NotFound.
func (s *Source) NodeCapacity(ctx context.Context, name string) (v1beta1.NodeCapacity, error) {
	var inv v1beta1.NodeInventory // a shallow copy of the cached object: read, never written
	if err := s.get(ctx, name, &inv, client.UnsafeDisableDeepCopy); err != nil {
		return v1beta1.NodeCapacity{}, err
	}
	return inv.Spec.Capacity, nil
}

// WarmCandidates returns up to limit warm sandboxes of template on fresh
// nodes, spread across nodes (see inventory.PickWarm). It reads the cache's
// objects without copying them and advances the reference like ListNodes.
func (s *Source) WarmCandidates(ctx context.Context, template string, limit int) ([]Candidate, error) {
	if limit <= 0 {
		return nil, nil
	}
	// Shallow copies of the cached objects: reordering them is safe,
	// writing through them is not, and PickWarm only reads.
	nodes, err := s.ListNodesShared(ctx)
	if err != nil {
		return nil, err
	}
	return inventory.PickWarm(nodes, template, limit), nil
}

// Join joins the shards of each of invs, read through reader, into its
// spec.sandboxes (deep copies), as a Source does for the fresh
// inventories, without the filter: for tools and tests that look at what
// the hosts published.
func Join(ctx context.Context, reader client.Reader, invs []v1beta1.NodeInventory) error {
	return New(reader, Options{}).joinAll(ctx, invs, true)
}

// joinAll joins the shards of each sharded node of nodes, a list of the
// fresh nodes, into its spec.sandboxes: deep copies with deep, else the
// cached entries themselves (nodes are then only read). It forgets the
// joins of nodes not in the list.
func (s *Source) joinAll(ctx context.Context, nodes []v1beta1.NodeInventory, deep bool) error {
	sharded := false
	for i := range nodes {
		sharded = sharded || nodes[i].Spec.SandboxShards > 0
	}
	if !sharded {
		s.prune(nodes)
		return nil
	}
	s.mu.Lock()
	tracked := s.tracked
	s.mu.Unlock()
	// Tracked, only the nodes with shard events since their last join
	// look, one shard at a time; else every shard is listed at once.
	lookup := s.getShard(ctx)
	if !tracked {
		var list v1beta1.NodeInventoryShardList
		// Shallow copies of the cached shards, only read.
		if err := s.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("list node inventory shards: %w", err)
		}
		byName := make(map[string]*v1beta1.NodeInventoryShard, len(list.Items))
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		lookup = func(name string) (*v1beta1.NodeInventoryShard, error) { return byName[name], nil }
	}
	for i := range nodes {
		if err := s.join(&nodes[i], lookup, deep); err != nil {
			return err
		}
	}
	s.prune(nodes)
	return nil
}

// prune forgets the joins of nodes not in nodes.
func (s *Source) prune(nodes []v1beta1.NodeInventory) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.joins) == 0 {
		return
	}
	keep := make(map[string]struct{}, len(nodes))
	for i := range nodes {
		keep[nodes[i].Name] = struct{}{}
	}
	for name := range s.joins {
		if _, ok := keep[name]; !ok {
			delete(s.joins, name)
		}
	}
	for name := range s.shardGens {
		if _, ok := keep[name]; !ok {
			delete(s.shardGens, name) // with its join: the next one reads the shards
		}
	}
}

// join puts the entries of inv's shards (found by lookup; nil: missing;
// their spec.sandboxes, then the valid entries of their spec.packed),
// with inv's spec.sandboxChanges applied to them, after its own
// spec.sandboxes. It makes inv's resourceVersion the newest of its own
// and its shards', or, when what is joined changed without a newer one
// (a shard that reached the cache after the inventory written after it),
// one more than the version the node was last given: readers that skip a
// node whose version did not change see every change. A shard whose spec
// names another node or index than its name is ignored: hosts cannot
// write one (api/policies), and a reader does not take one's word for
// it. inv is a copy the caller may change (its Spec and ObjectMeta are
// its own); with deep its sandboxes become deep copies too, else they
// share the cached shards'.
func (s *Source) join(inv *v1beta1.NodeInventory, lookup func(name string) (*v1beta1.NodeInventoryShard, error), deep bool) error {
	n := int(min(inv.Spec.SandboxShards, v1beta1.MaxInventoryShards))
	if n <= 0 {
		return nil
	}
	changes := ""
	if !inv.Spec.SandboxChanges.Empty() {
		changes = inv.ResourceVersion
	}
	s.mu.Lock()
	j := s.joins[inv.Name]
	stamp, clean := s.shardStamp(inv.Name), false
	if j != nil {
		// With tracked events, a node none of whose shards had an event
		// since its join was read has the same shards.
		clean = s.tracked && j.stamp == stamp && len(j.rvs) == n
	}
	s.mu.Unlock()
	var (
		shards []*v1beta1.NodeInventoryShard
		rvs    []string
		newest uint64
	)
	if clean {
		shards, rvs, newest = j.shards, j.rvs, j.rv
	} else {
		shards, rvs = make([]*v1beta1.NodeInventoryShard, n), make([]string, n)
		for k := range n {
			sh, err := lookup(v1beta1.ShardName(inv.Name, k))
			if err != nil {
				return err
			}
			if sh == nil || sh.Spec.Node != inv.Name || int(sh.Spec.Index) != k {
				continue
			}
			shards[k], rvs[k] = sh, sh.ResourceVersion
			if rv, err := strconv.ParseUint(sh.ResourceVersion, 10, 64); err == nil {
				newest = max(newest, rv)
			}
		}
	}
	prev, rebuilt := j, false
	wait, gaveUp := waitNone, uint64(0)
	if j != nil {
		wait, gaveUp = s.awaitShards(j, inv, newest)
	}
	switch {
	case wait == waitOn:
		// The host wrote shards before this inventory that this cache
		// has not delivered yet: the two watches run in no set order
		// between them, and after a fold the inventory no longer
		// carries the changes those shards now hold. The node keeps
		// the sandboxes of its last join until they arrive; their
		// event joins it again.
	case wait == waitOver || j == nil || !slices.Equal(j.rvs, rvs) || j.changes != changes:
		rebuilt = true
		// Built outside the lock: packed entries are decoded here, once
		// per version of their shard or inventory.
		j = joinShards(shards, rvs, newest, j)
		j.shards, j.gaveUp = shards, gaveUp
		if changes != "" {
			j.applyChanges(inv.Name, shards, inv.Spec.SandboxChanges, changes)
		} else {
			j.flatten()
		}
		s.mu.Lock()
		j.stamp = stamp
		s.joins[inv.Name] = j
		s.mu.Unlock()
	case !clean:
		// Read again and the same: the next join need not read them.
		s.mu.Lock()
		j.stamp = stamp
		s.mu.Unlock()
	}
	inv.Spec.SandboxChanges = nil // they are in the joined sandboxes

	own := inv.Spec.Sandboxes
	switch {
	case deep || len(own) > 0:
		all := make([]v1beta1.SandboxEntry, len(own)+len(j.sandboxes))
		copy(all, own) // the caller's own: a deep copy already, or only read
		for i := range j.sandboxes {
			if deep {
				j.sandboxes[i].DeepCopyInto(&all[len(own)+i])
			} else {
				all[len(own)+i] = j.sandboxes[i]
			}
		}
		inv.Spec.Sandboxes = all
	default:
		inv.Spec.Sandboxes = j.sandboxes
	}
	rv, err := strconv.ParseUint(inv.ResourceVersion, 10, 64)
	if err != nil && j.rv == 0 {
		return nil // nothing has a readable version
	}
	v := max(j.rv, rv)
	s.mu.Lock()
	if rebuilt && prev != nil {
		// What was joined may have changed: a version the readers have
		// not seen, even when a shard written before the inventory
		// reached this cache after it (its version is older).
		v = max(v, prev.returned+1)
	} else {
		v = max(v, j.returned)
	}
	j.returned = max(j.returned, v)
	s.mu.Unlock()
	inv.ResourceVersion = strconv.FormatUint(v, 10)
	return nil
}

// What a join does about the shard writes its inventory names.
const (
	waitNone = iota // its shards are as new, or it names none
	waitOn          // keep the last join: the shards are on their way
	waitOver        // join the shards as they are: waited long enough
)

// awaitShards is what the join of inv, whose node's shards are newest at
// the most, does about the shard write inv names, given j, the node's last
// join: wait while the reader's clock has not run a publish interval since
// it first saw that name, then join without them, once, with a warning
// (a shard deleted by someone other than its host would otherwise hold
// the node back until its host next writes a shard). gaveUp is what the
// next join records as given up on.
func (s *Source) awaitShards(j *joined, inv *v1beta1.NodeInventory, newest uint64) (wait int, gaveUp uint64) {
	want := shardsWritten(inv)
	s.mu.Lock()
	defer s.mu.Unlock()
	if newest >= want || want <= j.gaveUp {
		return waitNone, j.gaveUp
	}
	now := s.local.Now()
	if j.waitFor != want {
		j.waitFor, j.waitSince = want, now
	}
	if now.Sub(j.waitSince) < s.grace {
		return waitOn, j.gaveUp
	}
	slog.Warn("a NodeInventory names a write of its shards that this reader has not seen within a publish interval; its sandboxes are joined with the shards it has",
		"node", inv.Name, "shardsResourceVersion", want, "newest_shard", newest, "waited", s.grace)
	return waitOver, want
}

// shardsWritten is the resourceVersion of the newest shard write the host
// made before inv (spec.shardsResourceVersion); 0: not known.
func shardsWritten(inv *v1beta1.NodeInventory) uint64 {
	rv, err := strconv.ParseUint(inv.Spec.ShardsResourceVersion, 10, 64)
	if err != nil {
		return 0
	}
	return rv
}

// joinShards is the memo of a node's shards (by index; nil: missing or
// ignored): their spec.sandboxes, then the entries of their spec.packed
// that pass SandboxEntry.Validate, as the schema checks a listed one, by
// shard (its parts; flatten or applyChanges then makes its sandboxes). A
// shard at the same resourceVersion as in prev is taken from it, not
// decoded again.
func joinShards(shards []*v1beta1.NodeInventoryShard, rvs []string, rv uint64, prev *joined) *joined {
	j := &joined{rvs: rvs, rv: rv, parts: make([][]v1beta1.SandboxEntry, len(shards)), sorted: make([]bool, len(shards)), decoder: &packedDecoder{}}
	if prev != nil {
		j.decoder = prev.decoder
	}
	for k, sh := range shards {
		switch {
		case sh == nil:
			continue
		case prev != nil && k < len(prev.rvs) && rvs[k] != "" && prev.rvs[k] == rvs[k]:
			j.parts[k], j.sorted[k] = prev.parts[k], prev.sorted[k]
		default:
			part, err := sh.Spec.Entries()
			if err != nil {
				slog.Warn("a NodeInventoryShard's packed sandboxes are not all readable; the others are joined", "shard", sh.Name, "resourceVersion", sh.ResourceVersion, "error", err)
			}
			j.parts[k] = part
			j.sorted[k] = slices.IsSortedFunc(part, v1beta1.CompareSandboxIDs)
		}
	}
	return j
}

// partsLen is how many entries j's shards hold.
func (j *joined) partsLen() int {
	total := 0
	for _, part := range j.parts {
		total += len(part)
	}
	return total
}

// flatten makes j's sandboxes its parts' entries, in shard order.
func (j *joined) flatten() {
	j.sandboxes = make([]v1beta1.SandboxEntry, 0, j.partsLen())
	for _, part := range j.parts {
		j.sandboxes = append(j.sandboxes, part...)
	}
}

// applyChanges applies changes, those of the inventory of node at
// resourceVersion rv, to j's sandboxes: each applies to the shard its ID
// falls in, while that shard (shards, by index; nil: missing) was written
// by a fold no later than the changes' (a later one holds them already).
// A removed ID leaves its shard; a changed entry replaces the shard's
// entry of its ID, or joins the shard, before the first entry with a
// greater ID. j.parts stay the shards' own entries; j.sandboxes are
// made anew.
func (j *joined) applyChanges(node string, shards []*v1beta1.NodeInventoryShard, changes *v1beta1.SandboxChanges, rv string) {
	j.changes = rv
	entries, err := changes.EntriesUnpackedBy(j.decoder.decode)
	if err != nil {
		slog.Warn("a NodeInventory's changed sandboxes are not all readable; the others are joined", "node", node, "resourceVersion", rv, "error", err)
	}
	n := len(shards)
	applies := func(k int) bool { return shards[k] == nil || shards[k].Spec.Fold <= changes.Fold }
	touched := make([]bool, n)
	removed := make(map[string]struct{}, len(changes.Removed))
	for _, id := range changes.Removed {
		if k := v1beta1.ShardOf(id, n); applies(k) {
			removed[id], touched[k] = struct{}{}, true
		}
	}
	// changed: the last entry of each ID that applies; byShard: those
	// entries by shard, sorted by ID.
	changed := make(map[string]int, len(entries))
	shardOf := make([]int, len(entries))
	for i := range entries {
		shardOf[i] = v1beta1.ShardOf(entries[i].ID, n)
		if _, gone := removed[entries[i].ID]; !gone && applies(shardOf[i]) {
			changed[entries[i].ID] = i
		}
	}
	byShard := make([][]int, n)
	for i := range entries {
		if c, ok := changed[entries[i].ID]; ok && c == i {
			k := shardOf[i]
			byShard[k], touched[k] = append(byShard[k], i), true
		}
	}
	if len(changed) == 0 && len(removed) == 0 {
		j.flatten()
		return
	}
	byID := func(a, b int) int { return v1beta1.CompareSandboxIDs(entries[a], entries[b]) }
	out := make([]v1beta1.SandboxEntry, 0, j.partsLen()+len(changed))
	for k, part := range j.parts {
		if !touched[k] {
			out = append(out, part...)
			continue
		}
		// One pass over the shard and its changes, both by ID: a host
		// lists its sandboxes sorted by ID, so the joined shard is in the
		// order the host's next fold writes. A shard that is not sorted
		// is joined sorted.
		if !j.sorted[k] {
			part = slices.SortedStableFunc(slices.Values(part), v1beta1.CompareSandboxIDs)
		}
		cs := byShard[k]
		slices.SortFunc(cs, byID)
		for i := 0; i < len(part) || len(cs) > 0; {
			if len(cs) > 0 && (i == len(part) || entries[cs[0]].ID < part[i].ID) {
				out, cs = append(out, entries[cs[0]]), cs[1:] // new to the shard
				continue
			}
			id := part[i].ID
			if len(cs) > 0 && entries[cs[0]].ID == id {
				out, cs = append(out, entries[cs[0]]), cs[1:] // in place of the shard's
			} else if _, gone := removed[id]; !gone {
				out = append(out, part[i])
			}
			i++
		}
	}
	j.sandboxes = out
}

// get reads one inventory and applies the lookup filter: the stamp against
// the last stored reference.
func (s *Source) get(ctx context.Context, name string, inv *v1beta1.NodeInventory, opts ...client.GetOption) error {
	if err := s.reader.Get(ctx, client.ObjectKey{Name: name}, inv, opts...); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("get node inventory %s: %w", name, inventory.NotFound(name))
		}
		return fmt.Errorf("get node inventory %s: %w", name, err)
	}
	ref := s.reference()
	if behind, ok := s.behind(inv.PublishedAt, ref, s.local.Now()); !ok {
		return inventory.Stale(name, behind, s.staleAfter)
	}
	return nil
}

// fresh computes the reference from items, stores it, and compacts items in
// place to the fresh ones.
func (s *Source) fresh(items []v1beta1.NodeInventory) []v1beta1.NodeInventory {
	ref := s.advance(items)
	now := s.local.Now()
	kept := items[:0]
	for i := range items {
		if _, ok := s.behind(items[i].PublishedAt, ref, now); ok {
			kept = append(kept, items[i])
		}
	}
	clear(items[len(kept):])
	return kept
}

// advance computes the reference from items in one pass, starts, carries
// or ends a recovery against the last one, stores it and returns it.
func (s *Source) advance(items []v1beta1.NodeInventory) reference {
	var newest int64
	for i := range items {
		if ts, ok := stampNanos(items[i].PublishedAt); ok {
			newest = max(newest, ts)
		}
	}
	// With no readable stamp, newest and so the reference are zero: every
	// node is fresh.
	ref := min(newest, s.clock.Now().UnixNano())
	now := s.local.Now()
	for {
		prev := s.ref.Load()
		last := reference{}
		if prev != nil {
			last = *prev
		}
		next := reference{at: ref}
		switch {
		case last.at != 0 && ref-last.at > int64(s.staleAfter):
			next.before, next.until, next.deadline = last.at, ref+int64(s.grace), now.Add(s.grace)
		case last.recovering(now) && ref < last.until:
			next.before, next.until, next.deadline = last.before, last.until, last.deadline
		}
		if s.ref.CompareAndSwap(prev, &next) {
			return next
		}
	}
}

// behind returns how far a stamp trails the reference and whether the node
// is fresh at now: within the window, or during a recovery within the
// window of the reference before the jump. A zero reference and an
// unreadable stamp are fresh.
func (s *Source) behind(stamp *metav1.Time, ref reference, now time.Time) (time.Duration, bool) {
	if ref.at == 0 {
		return 0, true
	}
	ts, ok := stampNanos(stamp)
	if !ok {
		return 0, true
	}
	d := time.Duration(ref.at - ts)
	if d <= s.staleAfter {
		return d, true
	}
	return d, ref.recovering(now) && time.Duration(ref.before-ts) <= s.staleAfter
}

// maxStampSeconds is the first second whose nanoseconds may overflow an int64
// (April 2262).
const maxStampSeconds = math.MaxInt64 / int64(time.Second)

// stampNanos reads a publishedAt stamp as unix nanoseconds. It reports false
// for a stamp it cannot read: missing, zero, at or before the Unix epoch, or
// too late for int64 nanoseconds. The CRD's date-time format rejects a
// malformed value, but a reader never trusts that, and time.UnixNano is
// undefined out of range.
func stampNanos(stamp *metav1.Time) (int64, bool) {
	if stamp == nil {
		return 0, false
	}
	sec := stamp.Unix()
	if sec <= 0 || sec >= maxStampSeconds {
		return 0, false
	}
	return stamp.UnixNano(), true
}
