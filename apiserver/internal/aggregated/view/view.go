// Package view turns the fleet, as the freshness-filtered inventory source
// gives it, into the Sandbox objects that the aggregated API serves, with
// resourceVersions, a history of changes for watches and the recent
// snapshots that paged lists continue from.
//
// The view is rebuilt from Source.ListNodesShared after every inventory change
// (Notify, coalesced), and at least every resync period. Each rebuild that
// changes something is a batch: its changes become ADDED, MODIFIED and
// DELETED events, in key order, and the batch's snapshot is what a list
// answers until the next one. A node that turns stale leaves the source, so
// its sandboxes leave the view as DELETED events; when it returns they come
// back as ADDED.
//
// # resourceVersions
//
// A batch is numbered after the newest etcd revision among the inventories
// it was built from (never below the last batch's number plus one), so two
// replicas that watch the same etcd number the same state alike, and a
// client may list from one and watch from the other. (Not quite always: a
// batch with no newer write of a listed inventory behind it, a host turned
// stale or an inventory deleted, takes the last batch's number plus one,
// which the other replica may give to the write of that revision.) Within
// batch b, the i-th event has resourceVersion b<<20 | i+1 and the batch's
// snapshot b<<20 | 0xfffff: "every change up to and including batch b".
// The batch's last event carries the snapshot's number, so that a client
// that has seen the whole batch is at a version every replica numbers
// alike.
//
// Only those versions are. Two replicas may build batch b from different
// rebuilds (one coalesced two inventory changes that the other applied
// apart), so the changes of their batch b, and their order, can differ,
// and the state after its i-th event on one replica is no state the other
// ever had. A watch from a version inside a batch (the connection cut
// mid-batch, a selected sandbox's own resourceVersion) is therefore a 410
// Gone, whose informer lists again, on every replica, its own included:
// nothing in the number says which replica gave it. A watch that allows
// bookmarks gets one at the batch's end when the batch's last event was
// not for it, so that an informer with a selector leaves every batch at its
// end too.
package view

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/google/uuid"

	"github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	fleetv1beta1 "github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// Defaults of Options.
const (
	DefaultHistory   = 50_000
	DefaultSnapshots = 32
	DefaultResync    = 5 * time.Second
)

// seqBits is how many low bits of a resourceVersion number the events of
// one batch; snapshotSeq is the batch's own (its snapshot's) sequence.
const (
	seqBits     = 20
	snapshotSeq = 1<<seqBits - 1
	maxBatchSeq = snapshotSeq - 1
)

// Options configure a View.
type Options struct {
	// History is how many events the view keeps for watches that resume
	// from a resourceVersion; one further back gets 410 Gone and relists.
	// ≤ 0 means DefaultHistory.
	History int
	// Snapshots is how many past snapshots the view keeps for paged lists
	// (continue tokens) and exact-version lists; ≤ 0 means
	// DefaultSnapshots.
	Snapshots int
	// Resync bounds the time between rebuilds when no inventory changes
	// (a node's freshness can change with the clock alone when a
	// publisher's clock runs ahead); ≤ 0 means DefaultResync.
	Resync time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Event is one change of the view.
type Event struct {
	Type watch.EventType
	// Object is the sandbox after the change (for DELETED: as it was, with
	// the deletion's resourceVersion). It is shared: never modify it.
	Object *v1beta1.Sandbox
	// Prev is, for MODIFIED, the sandbox before the change (shared too): a
	// watch with a selector matches both, to tell a sandbox that leaves its
	// selection (DELETED) or enters it (ADDED) from one that changes in it.
	Prev *v1beta1.Sandbox
	rv   uint64
}

// Snapshot is the view as one batch left it. It is immutable.
type Snapshot struct {
	// RV is the snapshot's resourceVersion.
	RV uint64
	// items are sorted by namespace, then name; shared, never modified.
	items []*v1beta1.Sandbox
}

// Len returns the number of sandboxes in the snapshot.
func (s *Snapshot) Len() int { return len(s.items) }

// Items returns the snapshot's sandboxes, sorted by namespace then name. The
// slice and the objects are shared: never modify them.
func (s *Snapshot) Items() []*v1beta1.Sandbox { return s.items }

// Get returns the sandbox namespace/name, or nil.
func (s *Snapshot) Get(namespace, name string) *v1beta1.Sandbox {
	i, ok := slices.BinarySearchFunc(s.items, key{namespace, name}, compareKey)
	if !ok {
		return nil
	}
	return s.items[i]
}

// After returns the index of the first sandbox whose key sorts after
// namespace/name.
func (s *Snapshot) After(namespace, name string) int {
	i, ok := slices.BinarySearchFunc(s.items, key{namespace, name}, compareKey)
	if ok {
		i++
	}
	return i
}

// From returns the index of the first sandbox in namespace ("" is the
// start).
func (s *Snapshot) From(namespace string) int {
	i, _ := slices.BinarySearchFunc(s.items, key{namespace, ""}, compareKey)
	return i
}

type key struct{ namespace, name string }

func compareKey(sb *v1beta1.Sandbox, k key) int {
	if c := strings.Compare(sb.Namespace, k.namespace); c != 0 {
		return c
	}
	return strings.Compare(sb.Name, k.name)
}

func compareSandboxes(a, b *v1beta1.Sandbox) int { return compareKey(a, key{b.Namespace, b.Name}) }

// View is the fleet's sandboxes as Kubernetes objects. It is safe for
// concurrent use.
type View struct {
	src  inventory.Source
	opts Options
	log  *slog.Logger

	notify chan struct{}

	mu sync.Mutex
	// current is the last snapshot; nil until the first rebuild.
	current *Snapshot
	// nodes are current's sandboxes by node, with the resourceVersion of
	// the inventory they came from: an inventory seen at the same version
	// again is not looked at.
	nodes map[string]*nodeState
	// snapshots are the kept snapshots, oldest first; the last is current.
	snapshots []*Snapshot
	// history holds the newest events, oldest first.
	history []Event
	// floor is the oldest resourceVersion a watch may resume from: every
	// event after it is in history.
	floor uint64
	// changed is closed, and replaced, after each batch.
	changed chan struct{}
	batch   uint64
}

// New returns a View over src; Run fills it.
func New(src inventory.Source, opts Options) *View {
	if opts.History <= 0 {
		opts.History = DefaultHistory
	}
	if opts.Snapshots <= 0 {
		opts.Snapshots = DefaultSnapshots
	}
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &View{src: src, opts: opts, log: log, notify: make(chan struct{}, 1), changed: make(chan struct{})}
}

// Notify asks for a rebuild; calls between two rebuilds coalesce. It never
// blocks.
func (v *View) Notify() {
	select {
	case v.notify <- struct{}{}:
	default:
	}
}

// Run rebuilds the view on every Notify and at least every Resync, until
// ctx ends. The first rebuild happens at once.
func (v *View) Run(ctx context.Context) {
	t := time.NewTicker(v.opts.Resync)
	defer t.Stop()
	for {
		if err := v.Rebuild(ctx); err != nil && ctx.Err() == nil {
			v.log.WarnContext(ctx, "rebuild the sandbox view", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-v.notify:
		case <-t.C:
		}
	}
}

// Rebuild lists the fleet and applies what changed as one batch.
func (v *View) Rebuild(ctx context.Context) error {
	nodes, err := v.src.ListNodesShared(ctx) // only read: toSandbox copies what the view keeps
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var newest uint64
	for i := range nodes {
		if rv, err := strconv.ParseUint(nodes[i].ResourceVersion, 10, 64); err == nil {
			newest = max(newest, rv)
		}
	}

	v.mu.Lock()
	defer v.mu.Unlock()
	var changes []Event
	nextNodes := make(map[string]*nodeState, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		prev := v.nodes[n.Name]
		if prev != nil && prev.rv != "" && prev.rv == n.ResourceVersion {
			nextNodes[n.Name] = prev
			continue
		}
		ns := &nodeState{rv: n.ResourceVersion, items: make(map[key]*v1beta1.Sandbox, len(n.Spec.Sandboxes))}
		entries := inventory.Owned(n)
		for j := range entries {
			e := &entries[j]
			nsName := namespaceOf(e)
			if nsName == "" {
				continue // a warm sandbox of no pool: no namespace to show it in
			}
			k := key{nsName, e.ID}
			if _, dup := ns.items[k]; dup {
				continue
			}
			var old *v1beta1.Sandbox
			if prev != nil {
				old = prev.items[k]
			}
			if old != nil && same(old, n.Name, e) {
				ns.items[k] = old
				continue
			}
			sb := toSandbox(n.Name, nsName, e)
			ns.items[k] = sb
			typ := watch.Added
			if old != nil {
				typ = watch.Modified
			}
			changes = append(changes, Event{Type: typ, Object: sb, Prev: old})
		}
		if prev != nil {
			changes = appendDeleted(changes, prev, ns)
		}
		nextNodes[n.Name] = ns
	}
	for name, prev := range v.nodes {
		if _, ok := nextNodes[name]; !ok {
			changes = appendDeleted(changes, prev, nil) // the node left (stale or gone)
		}
	}
	if v.current != nil && len(changes) == 0 {
		v.nodes = nextNodes
		return nil
	}
	v.apply(newest, nextNodes, changes)
	return nil
}

// nodeState is one node's sandboxes in the view.
type nodeState struct {
	rv    string
	items map[key]*v1beta1.Sandbox
}

// appendDeleted appends a DELETED event for each of prev's sandboxes that
// next (nil: none) no longer has.
func appendDeleted(changes []Event, prev, next *nodeState) []Event {
	for k, sb := range prev.items {
		if next != nil {
			if _, ok := next.items[k]; ok {
				continue
			}
		}
		changes = append(changes, Event{Type: watch.Deleted, Object: sb.DeepCopy()})
	}
	return changes
}

// apply numbers a batch, records its events and snapshot and wakes the
// watchers. v.mu is held.
func (v *View) apply(newest uint64, nodes map[string]*nodeState, changes []Event) {
	slices.SortFunc(changes, func(a, b Event) int { return compareSandboxes(a.Object, b.Object) })
	batch := max(newest, v.batch+1)
	for i := range changes {
		rv := eventRV(batch, uint64(i), uint64(len(changes)), maxBatchSeq)
		changes[i].rv = rv
		changes[i].Object.ResourceVersion = strconv.FormatUint(rv, 10)
	}
	batch += spill(uint64(len(changes)), maxBatchSeq)
	v.batch = batch
	snap := &Snapshot{RV: batch<<seqBits | snapshotSeq, items: v.merge(changes)}
	if v.current == nil {
		v.floor = snap.RV
	}
	v.current, v.nodes = snap, nodes
	v.snapshots = append(v.snapshots, snap)
	if over := len(v.snapshots) - v.opts.Snapshots; over > 0 {
		clear(v.snapshots[:over])
		v.snapshots = slices.Delete(v.snapshots, 0, over)
	}
	v.history = append(v.history, changes...)
	// Watchers read slices of the history outside the lock, so it is never
	// changed in place: the events kept are copied to a new array, once
	// the history has grown a quarter past its bound.
	if over := len(v.history) - v.opts.History; over > v.opts.History/4 {
		v.floor = v.history[over-1].rv
		v.history = slices.Clone(v.history[over:])
	}
	close(v.changed)
	v.changed = make(chan struct{})
}

// spill is how many numbers after its own a batch of n changes takes, per
// to a number: a batch of more changes than one number can hold gives the
// rest the numbers of the batches after it.
func spill(n, per uint64) uint64 {
	if n == 0 {
		return 0
	}
	return (n - 1) / per
}

// eventRV is the resourceVersion of change i of a batch of n numbered from
// batch on (its own number, then those spill gives it), per to a number:
// b<<seqBits | seq, the last one at the batch's end (seq snapshotSeq of
// the batch's last number).
func eventRV(batch, i, n, per uint64) uint64 {
	if i == n-1 {
		return (batch+spill(n, per))<<seqBits | snapshotSeq
	}
	return (batch+i/per)<<seqBits | (i%per + 1)
}

// merge returns the current snapshot's items with changes (sorted by key)
// applied: one pass over the snapshot, rather than a sort of the fleet.
func (v *View) merge(changes []Event) []*v1beta1.Sandbox {
	var prev []*v1beta1.Sandbox
	if v.current != nil {
		prev = v.current.items
	}
	out := make([]*v1beta1.Sandbox, 0, len(prev)+len(changes))
	i := 0
	for _, c := range changes {
		k := key{c.Object.Namespace, c.Object.Name}
		// The unchanged run before k, found by binary search and copied
		// whole: a batch of a few changes in a fleet of 400,000 is a few
		// dozen comparisons, not one per sandbox.
		j, found := slices.BinarySearchFunc(prev[i:], k, compareKey)
		out = append(out, prev[i:i+j]...)
		i += j
		if found {
			i++ // modified or deleted: the old one goes
		}
		if c.Type != watch.Deleted {
			out = append(out, c.Object)
		}
	}
	return append(out, prev[i:]...)
}

// namespaceOf is the namespace a sandbox shows in: its team's, or for a
// warm one, its pool's.
func namespaceOf(e *fleetv1beta1.SandboxEntry) string {
	if e.Team != "" {
		return e.Team
	}
	ns, _, _ := strings.Cut(e.Pool, "/")
	return ns
}

// uidSpace namespaces the sandboxes' UIDs, which are derived from node and
// ID so that every replica gives a sandbox the same one.
var uidSpace = uuid.MustParse("6f1c2f0e-9d7e-4b8a-9a52-5d8d3c1f0b7a")

// toSandbox converts an inventory entry of node into a Sandbox in ns.
func toSandbox(node, ns string, e *fleetv1beta1.SandboxEntry) *v1beta1.Sandbox {
	sb := &v1beta1.Sandbox{
		TypeMeta: metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              e.ID,
			Namespace:         ns,
			UID:               types.UID(uuid.NewSHA1(uidSpace, []byte(node+"/"+e.ID)).String()),
			CreationTimestamp: metav1.NewTime(e.StartedAt.Time), // whole seconds in JSON
			Labels:            labelsOf(ns, e),
		},
		Spec: v1beta1.SandboxSpec{
			Template:  e.Template,
			NodeName:  node,
			Resources: v1beta1.SandboxResources{CPUMilli: e.CPUMilli, MemoryMiB: e.MemoryMiB},
			Pool:      e.Pool,
			Metadata:  maps.Clone(e.Metadata),
		},
		Status: v1beta1.SandboxStatus{State: v1beta1.SandboxState(e.State), StartedAt: e.StartedAt.MicroTime},
	}
	if e.EndAt != nil {
		t := e.EndAt.MicroTime
		sb.Spec.EndAt = &t
	}
	return sb
}

// labelsOf returns the labels of entry e shown in namespace ns: the
// metadata entries that are valid labels, so that a label selector selects
// sandboxes by their e2b metadata, and, for a warm sandbox of a pool in the
// pool's namespace, v1beta1.PoolLabel, its pool's status.selector (its
// name alone: in another namespace it would name that namespace's pool of
// the name). A claimed sandbox has it no more: the selector selects what
// the pool's status.replicas counts.
func labelsOf(ns string, e *fleetv1beta1.SandboxEntry) map[string]string {
	var out map[string]string
	set := func(k, val string) {
		if out == nil {
			out = make(map[string]string, len(e.Metadata)+1)
		}
		out[k] = val
	}
	for k, val := range e.Metadata {
		if k == v1beta1.PoolLabel || len(validation.IsQualifiedName(k)) != 0 || len(validation.IsValidLabelValue(val)) != 0 {
			continue
		}
		set(k, val)
	}
	if poolNS, name, ok := strings.Cut(e.Pool, "/"); ok && e.State == fleetv1beta1.SandboxWarm && poolNS == ns && len(validation.IsValidLabelValue(name)) == 0 {
		set(v1beta1.PoolLabel, name)
	}
	return out
}

// same reports whether sb is what entry e of node converts to.
func same(sb *v1beta1.Sandbox, node string, e *fleetv1beta1.SandboxEntry) bool {
	s := &sb.Spec
	if s.NodeName != node || s.Template != e.Template || s.Pool != e.Pool ||
		s.Resources.CPUMilli != e.CPUMilli || s.Resources.MemoryMiB != e.MemoryMiB ||
		sb.Status.State != v1beta1.SandboxState(e.State) || !sb.Status.StartedAt.Equal(&e.StartedAt.MicroTime) {
		return false
	}
	if (s.EndAt == nil) != (e.EndAt == nil) || (s.EndAt != nil && !s.EndAt.Equal(&e.EndAt.MicroTime)) {
		return false
	}
	return maps.Equal(s.Metadata, e.Metadata)
}

// Current returns the newest snapshot, or nil before the first rebuild.
func (v *View) Current() *Snapshot {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.current
}

// ErrNotReady is the answer before the first rebuild.
var ErrNotReady = errors.New("the sandbox view has not been built yet")

// At returns the kept snapshot whose resourceVersion is rv, or a 410 Gone
// error (apierrors.IsResourceExpired) when it is no longer kept.
func (v *View) At(rv uint64) (*Snapshot, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, s := range v.snapshots {
		if s.RV == rv {
			return s, nil
		}
	}
	return nil, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d: the list is no longer kept; list again", rv))
}

// tooLargeWait is how long a request for a resourceVersion the view has not
// reached yet waits for it.
const tooLargeWait = 3 * time.Second

// WaitFor returns the current snapshot once the view has reached rv (0: at
// once, once built), or an error: TooLargeResourceVersion after a few
// seconds, as the kube-apiserver's watch cache answers.
func (v *View) WaitFor(ctx context.Context, rv uint64) (*Snapshot, error) {
	timer := time.NewTimer(tooLargeWait)
	defer timer.Stop()
	for {
		v.mu.Lock()
		cur, changed := v.current, v.changed
		v.mu.Unlock()
		if cur != nil && cur.RV >= rv {
			return cur, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			if cur == nil {
				return nil, apierrors.NewServiceUnavailable(ErrNotReady.Error())
			}
			return nil, tooLarge(rv, cur.RV)
		case <-changed:
		}
	}
}

// since returns the events after rv, the channel closed on the next batch,
// and whether rv is still covered by the history.
func (v *View) since(rv uint64) ([]Event, <-chan struct{}, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if rv < v.floor {
		return nil, v.changed, false
	}
	i, _ := slices.BinarySearchFunc(v.history, rv, func(e Event, rv uint64) int { return cmp.Compare(e.rv, rv) })
	if i < len(v.history) && v.history[i].rv == rv {
		i++
	}
	return v.history[i:len(v.history):len(v.history)], v.changed, true
}

// insideBatch is the watch error for a resourceVersion inside a batch
// (the package's doc says why).
func insideBatch(rv uint64) *apierrors.StatusError {
	return apierrors.NewResourceExpired(fmt.Sprintf("resource version %d is inside a batch of changes, which another replica may have made of other changes; list again", rv))
}

// expired is the watch error for a resourceVersion older than the history.
func expired(rv uint64) *metav1.Status {
	st := apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d: the watch history no longer reaches it; list again", rv)).Status()
	return &st
}

// tooLarge is the kube-apiserver's answer for a resourceVersion its cache has
// not reached (k8s.io/apiserver/pkg/storage.NewTooLargeResourceVersionError):
// a timeout with a cause that client-go's reflector recognises.
func tooLarge(want, current uint64) error {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", want, current), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return err
}
