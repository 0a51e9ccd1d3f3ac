package placement_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
)

// stamped is n published at stamp.
func stamped(n *v1beta1.NodeInventory, stamp time.Time) *v1beta1.NodeInventory {
	t := metav1.NewTime(stamp)
	n.PublishedAt = &t
	return n
}

// starter is a create that succeeds, reporting sandboxes numbered from 1
// started at the host time it holds, and counts them by node.
type starter struct {
	started time.Time
	seq     atomic.Int64
	on      map[string]int
	ids     map[string][]string
}

func newStarter(started time.Time) *starter {
	return &starter{started: started, on: map[string]int{}, ids: map[string][]string{}}
}

func (s *starter) create(_ context.Context, n *v1beta1.NodeInventory) (placement.Created, error) {
	id := fmt.Sprintf("sb-%d", s.seq.Add(1))
	s.on[n.Name]++
	s.ids[n.Name] = append(s.ids[n.Name], id)
	return placement.Created{ID: id, StartedAt: s.started}, nil
}

// TestPlaceHoldsSpreadABurst proves that a burst of creates between two
// publishes spreads as if each saw the ones before it: the Placer counts what
// it placed until the nodes' inventories do, rather than sending the whole
// burst to the node that looked freest at the last publish.
func TestPlaceHoldsSpreadABurst(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	capa := res(100_000, 100*256, 100)
	src := inventory.NewStaticSource(
		stamped(node("a", capa, res(0, 0, 0), "base"), t0),
		stamped(node("b", capa, res(0, 5*256, 5), "base"), t0),
	)
	p := placement.New(src, seeded(2, 1))
	req := placement.Request{Template: "base", CPUMilli: 500, MemoryMiB: 256}
	s := newStarter(t0.Add(300 * time.Millisecond))
	for range 25 {
		if _, err := p.Place(t.Context(), req, s.create); err != nil {
			t.Fatal(err)
		}
	}
	// 30 in all, 5 of them on b before: 15 each, give or take the last tie.
	if a, b := s.on["a"], 5+s.on["b"]; a < 14 || b < 14 {
		t.Fatalf("25 creates after a publish: %d on a (0 before), %d on b (5 before); want them even", s.on["a"], s.on["b"])
	}
	if got := p.Held(); got != 25 {
		t.Fatalf("held = %d, want the 25 the inventories do not count", got)
	}
	if got := p.InFlight(); got != 0 {
		t.Fatalf("in flight = %d, want 0", got)
	}
}

// TestPlaceHoldEndsAtPublish proves that a placed sandbox stops counting at
// its node's first publish stamped a second or more after the host started
// it (that inventory counts it, so counting it too would count it twice),
// and not at an earlier one.
func TestPlaceHoldEndsAtPublish(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	capa := res(100_000, 100*256, 100)
	src := inventory.NewStaticSource(
		stamped(node("a", capa, res(0, 0, 0), "base"), t0),
		stamped(node("b", capa, res(0, 0, 0), "base"), t0),
	)
	p := placement.New(src, seeded(2, 1))
	req := placement.Request{Template: "base", CPUMilli: 500, MemoryMiB: 256}
	s := newStarter(t0.Add(400 * time.Millisecond))
	for range 10 {
		if _, err := p.Place(t.Context(), req, s.create); err != nil {
			t.Fatal(err)
		}
	}
	onA := s.on["a"]
	// a publishes in the second the sandboxes started: its stamp is before
	// they did, so it may not count them.
	src.Apply(stamped(node("a", capa, res(0, 0, 0), "base"), t0.Add(time.Second-time.Nanosecond)))
	if _, err := p.Place(t.Context(), req, s.create); err != nil {
		t.Fatal(err)
	}
	if got := p.Held(); got != 11 {
		t.Fatalf("held after a stamp in the start's second = %d, want 11", got)
	}
	// a publishes at the next whole second, before the start plus a second:
	// its inventory may have been read as the sandboxes started, so they
	// still count. b publishes a second later: its inventory counts them.
	heldOnA := s.on["a"]
	src.Apply(stamped(node("a", capa, res(0, 0, 0), "base"), t0.Add(time.Second)))
	src.Apply(stamped(node("b", capa, res(0, int64(s.on["b"])*256, int32(s.on["b"])), "base"), t0.Add(2*time.Second)))
	s.started = t0.Add(2500 * time.Millisecond)
	if _, err := p.Place(t.Context(), req, s.create); err != nil {
		t.Fatal(err)
	}
	if got := p.Held(); got != heldOnA+1 {
		t.Fatalf("held after both published = %d, want a's %d and the newest create", got, heldOnA)
	}
	if onA == 0 || onA == 10 {
		t.Fatalf("10 creates on two empty nodes put %d on a, want some on each", onA)
	}
}

// TestPlaceHoldStampAlreadyPast proves that a sandbox whose node has
// already published after it started (its create answered slowly) stops
// counting at the next placement, although the node's stamp has not
// changed since the Placer last read it.
func TestPlaceHoldStampAlreadyPast(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	src := inventory.NewStaticSource(stamped(node("a", res(100_000, 100*256, 100), res(0, 0, 0), "base"), t0.Add(5*time.Second)))
	p := placement.New(src, seeded(1, 1))
	req := placement.Request{Template: "base", MemoryMiB: 256}
	s := newStarter(t0)
	// Started after the stamp, before it, after it: the one before ends at
	// the next placement, although the node holds others and its stamp is
	// the one the Placer read at the placement before.
	for _, started := range []time.Duration{10 * time.Second, 0, 10 * time.Second} {
		s.started = t0.Add(started)
		if _, err := p.Place(t.Context(), req, s.create); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.Held(); got != 2 {
		t.Fatalf("held = %d, want the two started after the stamp", got)
	}
}

// TestPlaceForgetAndExpiry proves that Forget ends a sandbox's count (its
// killer was this process), that a hold ends at MaxHold by the Placer's
// clock when no publish does (a node without stamps), and that a create
// reporting nothing is not held.
func TestPlaceForgetAndExpiry(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC).UnixNano())
	src := inventory.NewStaticSource(node("a", res(100_000, 4*256, 100), res(0, 0, 0), "base"))
	p := placement.New(src, placement.Options{MaxHold: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	req := placement.Request{Template: "base", MemoryMiB: 256}
	s := newStarter(time.Time{})
	for range 4 {
		if _, err := p.Place(t.Context(), req, s.create); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Place(t.Context(), req, s.create); !errors.Is(err, placement.ErrNoCapacity) {
		t.Fatalf("fifth create on a node with room for 4 it placed = %v, want no capacity", err)
	}
	p.Forget(s.ids["a"][0])
	p.Forget("unknown")
	if got := p.Held(); got != 3 {
		t.Fatalf("held after Forget = %d, want 3", got)
	}
	if _, err := p.Place(t.Context(), req, s.create); err != nil {
		t.Fatalf("create after Forget = %v, want room for one", err)
	}
	now.Add(int64(time.Minute))
	if _, err := p.Place(t.Context(), req, func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		return placement.Created{}, nil
	}); err != nil {
		t.Fatalf("create after MaxHold = %v", err)
	}
	if got := p.Held(); got != 0 {
		t.Fatalf("held after MaxHold and a create reporting nothing = %d, want 0", got)
	}
}

// TestPlaceHoldEndsWhenListed proves that a placed sandbox stops counting
// at the first inventory of its node that lists it, however soon after its
// start that inventory is stamped (a host publishes a change at once, in the
// same second), while the ones it does not list go on counting.
func TestPlaceHoldEndsWhenListed(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	capa := res(100_000, 100*256, 100)
	src := inventory.NewStaticSource(stamped(node("a", capa, res(0, 0, 0), "base"), t0))
	p := placement.New(src, seeded(1, 1))
	req := placement.Request{Template: "base", MemoryMiB: 256}
	s := newStarter(t0.Add(200 * time.Millisecond))
	for range 5 {
		if _, err := p.Place(t.Context(), req, s.create); err != nil {
			t.Fatal(err)
		}
	}
	inv := stamped(node("a", capa, res(0, 3*256, 3), "base"), t0.Add(300*time.Millisecond))
	for _, id := range s.ids["a"][:3] {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxRunning, MemoryMiB: 256})
	}
	src.Apply(inv)
	// A create that reports nothing, to prune without adding a hold.
	if _, err := p.Place(t.Context(), req, func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		return placement.Created{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := p.Held(); got != 2 {
		t.Fatalf("held after an inventory listing 3 of 5 = %d, want 2", got)
	}
}

// TestHoldCountsForks proves that sandboxes started on a node without
// Place (a fork's, on its source's node) count against the node through
// Hold until its inventory lists them, as placed ones do: the creates after
// them go to the other node.
func TestHoldCountsForks(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	capa := res(100_000, 100*256, 100)
	src := inventory.NewStaticSource(
		stamped(node("a", capa, res(0, 0, 0), "base"), t0),
		stamped(node("b", capa, res(0, 0, 0), "base"), t0),
	)
	p := placement.New(src, seeded(2, 1))
	req := placement.Request{Template: "base", CPUMilli: 500, MemoryMiB: 256}
	p.Hold("a", req, placement.Created{}) // a zero Created: nothing to count
	for i := range 4 {
		p.Hold("a", req, placement.Created{ID: fmt.Sprintf("fork-%d", i), StartedAt: t0.Add(200 * time.Millisecond)})
	}
	if got := p.Held(); got != 4 {
		t.Fatalf("held = %d, want the 4 forks", got)
	}
	s := newStarter(t0.Add(300 * time.Millisecond))
	for range 4 {
		if _, err := p.Place(t.Context(), req, s.create); err != nil {
			t.Fatal(err)
		}
	}
	if s.on["a"] != 0 || s.on["b"] != 4 {
		t.Fatalf("4 creates after 4 forks on a: %d on a, %d on b; want all on b", s.on["a"], s.on["b"])
	}
	// a's inventory lists the forks: they stop counting.
	inv := stamped(node("a", capa, res(2000, 4*256, 4), "base"), t0.Add(400*time.Millisecond))
	for i := range 4 {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: fmt.Sprintf("fork-%d", i), Template: "base", State: v1beta1.SandboxRunning, CPUMilli: 500, MemoryMiB: 256})
	}
	src.Apply(inv)
	if _, err := p.Place(t.Context(), req, func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		return placement.Created{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := p.Held(); got != 4 {
		t.Fatalf("held after a's inventory listed its forks = %d, want b's 4", got)
	}
}
