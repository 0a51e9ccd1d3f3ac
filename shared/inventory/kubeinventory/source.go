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
package kubeinventory

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	clock      clock.PassiveClock
	grace      time.Duration
	// ref is what the last list computed; nil before the first.
	ref atomic.Pointer[reference]
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
	return &Source{reader: reader, staleAfter: opts.StaleAfter, grace: opts.PublishInterval, clock: opts.Clock}
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
	return s.fresh(list.Items), nil
}

// NodeInventory returns one fresh inventory, a deep copy the caller owns. An
// absent or stale node is a NotFound for nodeinventories.skiff.dev.
func (s *Source) NodeInventory(ctx context.Context, name string) (*v1beta1.NodeInventory, error) {
	inv := &v1beta1.NodeInventory{}
	if err := s.get(ctx, name, inv); err != nil {
		return nil, err
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
	var list v1beta1.NodeInventoryList
	// Items are shallow copies of the cached objects: reordering them is
	// safe, writing through them is not, and PickWarm only reads.
	if err := s.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list node inventories: %w", err)
	}
	return inventory.PickWarm(s.fresh(list.Items), template, limit), nil
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
	if behind, ok := s.behind(inv.PublishedAt, ref, s.clock.Now()); !ok {
		return inventory.Stale(name, behind, s.staleAfter)
	}
	return nil
}

// fresh computes the reference from items, stores it, and compacts items in
// place to the fresh ones.
func (s *Source) fresh(items []v1beta1.NodeInventory) []v1beta1.NodeInventory {
	ref := s.advance(items)
	now := s.clock.Now()
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
	now := s.clock.Now()
	ref := min(newest, now.UnixNano())
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
