package kubeinventory

import (
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// fleet is a reader whose inventories a test re-stamps, as publishers do,
// with a clock that moves with them.
type fleet struct {
	t      *testing.T
	reader client.Client
	clock  *clocktesting.FakePassiveClock
	src    *Source
}

// newFleet has a 10 s window and a 3 s publish interval, and nodes stamped
// at their offsets from now.
func newFleet(t *testing.T, stamps map[string]time.Duration) *fleet {
	t.Helper()
	invs := make([]*v1beta1.NodeInventory, 0, len(stamps))
	for name, d := range stamps {
		invs = append(invs, node(name, ago(-d)))
	}
	f := &fleet{t: t, reader: newReader(t, invs...).(client.Client), clock: clocktesting.NewFakePassiveClock(now)}
	f.src = New(f.reader, Options{StaleAfter: 10 * time.Second, PublishInterval: 3 * time.Second, Clock: f.clock})
	return f
}

// publish stamps name at offset from now and moves the clock there.
func (f *fleet) publish(name string, offset time.Duration) {
	f.t.Helper()
	at := now.Add(offset)
	if at.After(f.clock.Now()) {
		f.clock.SetTime(at)
	}
	inv := &v1beta1.NodeInventory{}
	if err := f.reader.Get(f.t.Context(), client.ObjectKey{Name: name}, inv); err != nil {
		f.t.Fatal(err)
	}
	inv.PublishedAt = &metav1.Time{Time: at}
	if err := f.reader.Update(f.t.Context(), inv); err != nil {
		f.t.Fatal(err)
	}
}

// fresh asserts the listed nodes and that each lookup agrees with the list.
func (f *fleet) fresh(want ...string) {
	f.t.Helper()
	assertNames(f.t, listNames(f.t, f.src), want...)
	var all v1beta1.NodeInventoryList
	if err := f.reader.List(f.t.Context(), &all); err != nil {
		f.t.Fatal(err)
	}
	for _, inv := range all.Items {
		listed := false
		for _, w := range want {
			listed = listed || w == inv.Name
		}
		_, err := f.src.NodeInventory(f.t.Context(), inv.Name)
		if listed && err != nil {
			f.t.Fatalf("NodeInventory(%s) = %v, want fresh as listed", inv.Name, err)
		}
		if !listed && !apierrors.IsNotFound(err) {
			f.t.Fatalf("NodeInventory(%s) = %v, want NotFound as not listed", inv.Name, err)
		}
	}
}

// A write outage longer than the window: when the first host publishes
// again, the other live host keeps its place until it publishes too.
func TestRecoveryKeepsLiveHosts(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": -time.Second, "b": -time.Second})
	f.fresh("a", "b")
	f.publish("a", 15*time.Second) // 16 s after the last reference
	f.fresh("a", "b")
	f.publish("a", 17*time.Second)
	f.fresh("a", "b")
	f.publish("b", 17*time.Second)
	f.fresh("a", "b")
	// Long after the recovery, the ordinary window again.
	f.publish("a", 27*time.Second)
	f.fresh("a", "b")
	f.publish("a", 28*time.Second)
	f.fresh("a")
}

// A host dead throughout an outage leaves one publish interval after the
// first publish that ended it (D-03): at a reference PublishInterval past
// the jump, not before.
func TestRecoveryDeadHostLeavesAfterOneInterval(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": -time.Second, "dead": -time.Second})
	f.fresh("a", "dead")
	f.publish("a", 15*time.Second)
	f.fresh("a", "dead")
	f.publish("a", 17*time.Second)
	f.fresh("a", "dead")
	f.publish("a", 18*time.Second) // 3 s past the jump
	f.fresh("a")
}

// A live host's publishes after a change restart its interval, so its
// stamps need not reach one interval past the jump on time: the recovery
// also ends one interval after the reader saw the jump on its own clock,
// for lists and lookups alike, and the dead host leaves then (D-03).
func TestRecoveryEndsOneIntervalOnTheReadersClock(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": -time.Second, "dead": -time.Second})
	f.fresh("a", "dead")
	f.publish("a", 15*time.Second) // the jump, seen at 15 s
	f.fresh("a", "dead")
	f.publish("a", 16*time.Second) // a change: a's next stamp is due at 19 s
	f.clock.SetTime(now.Add(17900 * time.Millisecond))
	f.fresh("a", "dead")
	f.clock.SetTime(now.Add(18 * time.Second))
	// No publish and no list since 16 s: the lookup alone sees it end.
	if _, err := f.src.NodeInventory(t.Context(), "dead"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInventory(dead) one interval after the jump = %v, want NotFound", err)
	}
	f.fresh("a")
	// It stays over: a's late stamp does not start it again.
	f.publish("a", 19*time.Second)
	f.fresh("a")
}

// The recovery's end is measured on Local, the reader's own clock: the
// clock that caps the reference (the kube-apiserver's time, corrected now
// and then by shared/serverclock) may jump, and must not end it early.
func TestRecoveryEndsOnTheLocalClock(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": -time.Second, "dead": -time.Second})
	local := clocktesting.NewFakePassiveClock(now)
	f.src = New(f.reader, Options{StaleAfter: 10 * time.Second, PublishInterval: 3 * time.Second, Clock: f.clock, Local: local})
	f.fresh("a", "dead")
	f.publish("a", 15*time.Second) // the jump
	local.SetTime(now.Add(15 * time.Second))
	f.fresh("a", "dead")
	// The cap's clock is corrected a minute ahead; the reader's own has
	// moved a second.
	f.clock.SetTime(now.Add(75 * time.Second))
	local.SetTime(now.Add(16 * time.Second))
	f.fresh("a", "dead")
	local.SetTime(now.Add(18 * time.Second)) // one interval after the jump
	f.fresh("a")
}

// A live host that publishes within the interval after the jump keeps its
// place through the end of the recovery, whichever rule ends it.
func TestRecoveryByClockKeepsLiveHosts(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": -time.Second, "b": -time.Second})
	f.fresh("a", "b")
	f.publish("a", 15*time.Second)
	f.publish("a", 16*time.Second)
	f.publish("b", 17500*time.Millisecond)
	f.fresh("a", "b")
	f.clock.SetTime(now.Add(25 * time.Second))
	f.fresh("a", "b")
}

// Only nodes fresh against the reference before the jump keep their place:
// exactly the window behind it stays, one second more does not.
func TestRecoveryOnlyNodesFreshBefore(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{
		"a":         0,
		"at-window": -10 * time.Second,
		"past":      -11 * time.Second,
	})
	f.fresh("a", "at-window")
	f.publish("a", 20*time.Second)
	f.fresh("a", "at-window")
}

// A jump of exactly the window is ordinary publishing, not a recovery.
func TestJumpOfTheWindowIsNoRecovery(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": 0, "b": -time.Second})
	f.fresh("a", "b")
	f.publish("a", 10*time.Second)
	f.fresh("a")
}

// Every node fresh until the first list: the first list is no jump.
func TestFirstListIsNoRecovery(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": 0, "old": -time.Hour})
	f.fresh("a")
}

// Observe advances the reference on every event, so that a reader that
// lists seldom does not take its own silence for an outage: the dead host
// leaves as the live one's publishes go by.
func TestObserveFollowsEveryPublish(t *testing.T) {
	f := newFleet(t, map[string]time.Duration{"a": 0, "dead": 0})
	f.fresh("a", "dead")
	for _, at := range []time.Duration{3, 6, 9, 12, 15, 18} {
		f.publish("a", at*time.Second)
		if err := f.src.Observe(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	f.fresh("a")

	// The same publishes with no Observe: one 18 s jump, a recovery.
	g := newFleet(t, map[string]time.Duration{"a": 0, "dead": 0})
	g.fresh("a", "dead")
	g.publish("a", 18*time.Second)
	g.fresh("a", "dead")
}
