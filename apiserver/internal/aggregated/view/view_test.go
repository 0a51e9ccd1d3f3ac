package view

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// id returns the n-th sandbox ID of node: 20 characters ending in its tag.
func id(node string, n int) string {
	tag := string(sandboxid.NodeTag(node))
	s := fmt.Sprintf("%0*d", sandboxid.Len-len(tag), n)
	return s + tag
}

func entry(node string, n int, team string) v1beta1.SandboxEntry {
	return v1beta1.SandboxEntry{ID: id(node, n), Template: "base", State: v1beta1.SandboxRunning, Team: team,
		StartedAt: v1beta1.NewMicroTime(t0), CPUMilli: 1000, MemoryMiB: 256, Metadata: map[string]string{"app": "x", "has space": "v"}}
}

func node(name string, rv int, entries ...v1beta1.SandboxEntry) *v1beta1.NodeInventory {
	inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: strconv.Itoa(rv)}}
	inv.Spec.Sandboxes = entries
	return inv
}

func rebuild(t *testing.T, v *View) {
	t.Helper()
	if err := v.Rebuild(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestBatchesNumberedByTheNewestInventory(t *testing.T) {
	src := inventory.NewStaticSource(node("n1", 100, entry("n1", 1, "a"), entry("n1", 2, "b")))
	v := New(src, Options{})
	if _, err := v.At(0); !apierrors.IsResourceExpired(err) {
		t.Fatalf("At before the first build: %v", err)
	}
	rebuild(t, v)
	s := v.Current()
	if s.RV != 100<<seqBits|snapshotSeq || s.Len() != 2 {
		t.Fatalf("snapshot rv %d len %d", s.RV, s.Len())
	}
	sb := s.Get("a", id("n1", 1))
	if sb == nil || sb.Spec.NodeName != "n1" || sb.Status.State != sbv1.SandboxRunning || sb.Spec.Resources.MemoryMiB != 256 {
		t.Fatalf("get: %+v", sb)
	}
	if sb.Labels["app"] != "x" || len(sb.Labels) != 1 || len(sb.Spec.Metadata) != 2 {
		t.Errorf("labels %v metadata %v: want the valid label only in labels, all in metadata", sb.Labels, sb.Spec.Metadata)
	}
	if sb.ResourceVersion != strconv.FormatUint(100<<seqBits|1, 10) {
		t.Errorf("rv of the first event %s", sb.ResourceVersion)
	}

	// A republish of the same content is no batch.
	src.Apply(node("n1", 101, entry("n1", 1, "a"), entry("n1", 2, "b")))
	rebuild(t, v)
	if v.Current() != s {
		t.Fatal("an unchanged republish made a new snapshot")
	}
	// A change numbers its batch after the inventory's revision.
	e := entry("n1", 1, "a")
	e.State = v1beta1.SandboxPaused
	src.Apply(node("n1", 105, e))
	rebuild(t, v)
	s2 := v.Current()
	if s2.RV != 105<<seqBits|snapshotSeq || s2.Len() != 1 {
		t.Fatalf("second snapshot rv %d len %d", s2.RV, s2.Len())
	}
	events, _, ok := v.since(s.RV)
	if !ok || len(events) != 2 {
		t.Fatalf("events since the first snapshot: %v %d", ok, len(events))
	}
	// Key order: a/…1 (modified) before b/…2 (deleted).
	if events[0].Type != watch.Modified || events[0].Object.Status.State != sbv1.SandboxPaused || events[1].Type != watch.Deleted || events[1].Object.Namespace != "b" {
		t.Errorf("events %v %v", events[0], events[1])
	}
	// The last is at the batch's end.
	if events[0].rv != 105<<seqBits|1 || events[1].rv != 105<<seqBits|snapshotSeq {
		t.Errorf("event rvs %d %d", events[0].rv, events[1].rv)
	}
	// The first snapshot is still what it was.
	if s.Get("b", id("n1", 2)) == nil || s.Get("a", id("n1", 1)).Status.State != sbv1.SandboxRunning {
		t.Error("an old snapshot changed")
	}
	// An inventory whose revision went back (deleted and recreated) still
	// moves the batch number forward.
	src.Apply(node("n1", 7))
	rebuild(t, v)
	if v.Current().RV != 106<<seqBits|snapshotSeq {
		t.Errorf("rv after a lower revision %d", v.Current().RV)
	}
}

// A Sandbox's startedAt and endAt are its entry's, to the microsecond, and
// a change of the fraction alone is a change; creationTimestamp is the
// start in whole seconds.
func TestSandboxTimesInMicroseconds(t *testing.T) {
	e := entry("n1", 1, "a")
	e.StartedAt = v1beta1.NewMicroTime(t0.Add(20_345 * time.Microsecond))
	end := v1beta1.NewMicroTime(e.StartedAt.Add(time.Hour))
	e.EndAt = &end
	src := inventory.NewStaticSource(node("n1", 100, e))
	v := New(src, Options{})
	rebuild(t, v)
	sb := v.Current().Get("a", id("n1", 1))
	raw, err := json.Marshal(sb)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"startedAt":"2026-12-02T10:00:00.020345Z"`, `"endAt":"2026-12-02T11:00:00.020345Z"`, `"creationTimestamp":"2026-12-02T10:00:00Z"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("sandbox %s: no %s", raw, want)
		}
	}
	e.StartedAt = v1beta1.NewMicroTime(e.StartedAt.Add(time.Microsecond))
	src.Apply(node("n1", 101, e))
	rebuild(t, v)
	if got := v.Current().Get("a", id("n1", 1)); got == sb || !got.Status.StartedAt.Time.Equal(e.StartedAt.Time) {
		t.Errorf("a start a microsecond later: %v, want %v", got.Status.StartedAt, e.StartedAt)
	}
}

func TestWarmSandboxesShowInTheirPoolsNamespace(t *testing.T) {
	warm := v1beta1.SandboxEntry{ID: id("n1", 1), Template: "base", State: v1beta1.SandboxWarm, Pool: "pools/base", StartedAt: v1beta1.NewMicroTime(t0)}
	orphan := v1beta1.SandboxEntry{ID: id("n1", 2), Template: "base", State: v1beta1.SandboxWarm, StartedAt: v1beta1.NewMicroTime(t0)}
	foreign := entry("other", 3, "a") // another node's tag: not n1's to list
	src := inventory.NewStaticSource(node("n1", 10, warm, orphan, foreign))
	v := New(src, Options{})
	rebuild(t, v)
	s := v.Current()
	if s.Len() != 1 || s.Get("pools", id("n1", 1)) == nil {
		t.Fatalf("items %v", s.Items())
	}
	// It carries its pool's label, the pool's status.selector.
	if l := s.Get("pools", id("n1", 1)).Labels; len(l) != 1 || l[sbv1.PoolLabel] != "base" {
		t.Errorf("labels of a warm sandbox %v, want %s=base", l, sbv1.PoolLabel)
	}
	// A claim moves it to the team's namespace: DELETED there, ADDED here,
	// without the label, which there would name a pool of that namespace.
	// Claimed by the pool's namespace, it loses it too: the selector
	// selects what the pool's replicas count, its warm sandboxes.
	// Metadata cannot set it.
	claimed := warm
	claimed.State, claimed.Team = v1beta1.SandboxRunning, "a"
	claimed.Metadata = map[string]string{sbv1.PoolLabel: "other", "app": "web"}
	home := warm
	home.ID, home.State, home.Team = id("n1", 4), v1beta1.SandboxRunning, "pools"
	cold := entry("n1", 5, "pools")
	cold.Metadata = map[string]string{sbv1.PoolLabel: "base"}
	src.Apply(node("n1", 11, claimed, home, cold))
	rebuild(t, v)
	events, _, _ := v.since(s.RV)
	if len(events) != 4 || events[0].Type != watch.Added || events[0].Object.Namespace != "a" || events[1].Type != watch.Deleted || events[1].Object.Namespace != "pools" {
		t.Fatalf("events %+v", events)
	}
	cur := v.Current()
	for _, tc := range []struct {
		ns, id string
		want   map[string]string
	}{
		{"a", id("n1", 1), map[string]string{"app": "web"}},
		{"pools", id("n1", 4), nil},
		{"pools", id("n1", 5), nil},
	} {
		if sb := cur.Get(tc.ns, tc.id); sb == nil || !maps.Equal(sb.Labels, tc.want) {
			t.Errorf("%s/%s: %+v, want labels %v", tc.ns, tc.id, sb, tc.want)
		}
	}
}

func TestHistoryAndSnapshotsAreBounded(t *testing.T) {
	src := inventory.NewStaticSource(node("n1", 1))
	v := New(src, Options{History: 3, Snapshots: 2})
	rebuild(t, v)
	first := v.Current().RV
	for i := 1; i <= 4; i++ {
		src.Apply(node("n1", 1+i, entry("n1", i, "a")))
		rebuild(t, v) // each adds one and deletes one (but the first)
	}
	if _, _, ok := v.since(first); ok {
		t.Error("the history still reaches the first snapshot after 7 events in a history of 3")
	}
	if _, err := v.At(first); !apierrors.IsResourceExpired(err) {
		t.Errorf("At(first): %v, want 410", err)
	}
	cur := v.Current()
	if s, err := v.At(cur.RV); err != nil || s != cur {
		t.Errorf("At(current): %v", err)
	}
	if _, _, ok := v.since(cur.RV); !ok {
		t.Error("the history does not reach the current snapshot")
	}
}

func TestWaitForAnswersTooLargeAfterAWhile(t *testing.T) {
	v := New(inventory.NewStaticSource(node("n1", 5)), Options{})
	rebuild(t, v)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := v.WaitFor(ctx, v.Current().RV+1)
	st := &apierrors.StatusError{}
	if !apierrors.IsTimeout(err) || !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("WaitFor ahead: %v (%T %v)", err, err, st)
	}
}

func recv(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case e, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("watch closed")
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event in 10s")
	}
	return watch.Event{}
}

// watchFrom starts a watch of v that the test's end stops.
func watchFrom(ctx context.Context, t *testing.T, v *View, o WatchOptions) watch.Interface {
	t.Helper()
	w, err := v.Watch(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

func TestWatch(t *testing.T) {
	src := inventory.NewStaticSource(node("n1", 10, entry("n1", 1, "a"), entry("n1", 2, "b")), node("n2", 11, entry("n2", 1, "a")))
	v := New(src, Options{})
	rebuild(t, v)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	// The opening burst: one ADDED each of the selected sandboxes.
	w := watchFrom(ctx, t, v, WatchOptions{Filter: func(sb *sbv1.Sandbox) bool { return sb.Namespace == "a" }})
	seen := map[string]bool{}
	for range 2 {
		e := recv(t, w)
		if e.Type != watch.Added {
			t.Fatalf("burst: %v", e.Type)
		}
		seen[e.Object.(*sbv1.Sandbox).Name] = true
	}
	if !seen[id("n1", 1)] || !seen[id("n2", 1)] {
		t.Fatalf("burst %v", seen)
	}
	// n2 leaves (stale): DELETED for its sandbox; b's change is filtered.
	src.Remove("n2")
	src.Apply(node("n1", 12, entry("n1", 1, "a")))
	rebuild(t, v)
	if e := recv(t, w); e.Type != watch.Deleted || e.Object.(*sbv1.Sandbox).Name != id("n2", 1) {
		t.Fatalf("after n2 left: %v %v", e.Type, e.Object)
	}
	afterLeave := v.Current().RV
	// n2 returns: ADDED again.
	src.Apply(node("n2", 13, entry("n2", 1, "a")))
	rebuild(t, v)
	if e := recv(t, w); e.Type != watch.Added || e.Object.(*sbv1.Sandbox).Name != id("n2", 1) {
		t.Fatalf("after n2 returned: %v", e.Type)
	}

	// A watch from a resourceVersion resumes after it, without a burst.
	w2 := watchFrom(ctx, t, v, WatchOptions{ResourceVersion: afterLeave})
	if e := recv(t, w2); e.Type != watch.Added || e.Object.(*sbv1.Sandbox).Name != id("n2", 1) {
		t.Fatalf("resumed: %v", e.Type)
	}
	// sendInitialEvents: the snapshot, then the bookmark that ends it.
	w3 := watchFrom(ctx, t, v, WatchOptions{SendInitialEvents: true, Bookmarks: true, BookmarkInterval: 50 * time.Millisecond})
	for range 2 {
		if e := recv(t, w3); e.Type != watch.Added {
			t.Fatalf("initial: %v", e.Type)
		}
	}
	e := recv(t, w3)
	if e.Type != watch.Bookmark || e.Object.(*sbv1.Sandbox).Annotations[InitialEventsEnd] != "true" ||
		e.Object.(*sbv1.Sandbox).ResourceVersion != strconv.FormatUint(v.Current().RV, 10) {
		t.Fatalf("end of initial events: %v %+v", e.Type, e.Object)
	}
	// Then periodic bookmarks at the watch's position.
	if e := recv(t, w3); e.Type != watch.Bookmark || e.Object.(*sbv1.Sandbox).Annotations != nil {
		t.Fatalf("bookmark: %v", e.Type)
	}

	// Too old: 410.
	if _, err := v.Watch(ctx, WatchOptions{ResourceVersion: 1}); !apierrors.IsResourceExpired(err) {
		t.Errorf("watch from rv 1: %v, want 410 Gone", err)
	}
	// Stop closes the channel.
	w.Stop()
	for range w.ResultChan() {
	}
}

// A watch with a selector sees a sandbox that a change takes out of the
// selection as DELETED (as it was last selected, at the change's
// resourceVersion) and one a change brings in as ADDED, as the
// kube-apiserver's watch cache sends them.
func TestWatchWithASelectorSeesSandboxesLeaveAndEnter(t *testing.T) {
	running, other := entry("n1", 1, "a"), entry("n1", 2, "a")
	src := inventory.NewStaticSource(node("n1", 10, running, other))
	v := New(src, Options{})
	rebuild(t, v)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := watchFrom(ctx, t, v, WatchOptions{Filter: func(sb *sbv1.Sandbox) bool { return sb.Status.State == sbv1.SandboxRunning }})
	for range 2 {
		if e := recv(t, w); e.Type != watch.Added {
			t.Fatalf("burst: %v", e.Type)
		}
	}
	// A change within the selection is MODIFIED.
	running.CPUMilli = 2000
	src.Apply(node("n1", 11, running, other))
	rebuild(t, v)
	e := recv(t, w)
	if e.Type != watch.Modified || e.Object.(*sbv1.Sandbox).Spec.Resources.CPUMilli != 2000 {
		t.Fatalf("a change in the selection: %v %+v", e.Type, e.Object)
	}
	before := e.Object.(*sbv1.Sandbox)
	// Paused, it leaves the selection: DELETED, the running sandbox it
	// was, at the pause's resourceVersion.
	paused := running
	paused.State = v1beta1.SandboxPaused
	src.Apply(node("n1", 12, paused, other))
	rebuild(t, v)
	e = recv(t, w)
	gone, _ := e.Object.(*sbv1.Sandbox)
	if e.Type != watch.Deleted || gone.Name != id("n1", 1) || gone.Status.State != sbv1.SandboxRunning || gone.Spec.Resources.CPUMilli != 2000 {
		t.Fatalf("after the pause: %v %+v", e.Type, e.Object)
	}
	pauseRV := strconv.FormatUint(12<<seqBits|snapshotSeq, 10)
	if gone.ResourceVersion != pauseRV || before.ResourceVersion == pauseRV {
		t.Errorf("DELETED at resourceVersion %s (the sandbox's before: %s), want the pause's %s", gone.ResourceVersion, before.ResourceVersion, pauseRV)
	}
	if v.Current().Get("a", id("n1", 1)).Status.State != sbv1.SandboxPaused {
		t.Error("the watch's DELETED object changed the view's")
	}
	// Changes outside the selection are not sent; the other sandbox's is.
	paused.MemoryMiB = 512
	other.MemoryMiB = 512
	src.Apply(node("n1", 13, paused, other))
	rebuild(t, v)
	if e := recv(t, w); e.Type != watch.Modified || e.Object.(*sbv1.Sandbox).Name != id("n1", 2) {
		t.Fatalf("after changes to a paused and a running sandbox: %v %+v", e.Type, e.Object)
	}
	// Resumed, it enters again: ADDED.
	src.Apply(node("n1", 14, running, other))
	rebuild(t, v)
	if e := recv(t, w); e.Type != watch.Added || e.Object.(*sbv1.Sandbox).Name != id("n1", 1) || e.Object.(*sbv1.Sandbox).Status.State != sbv1.SandboxRunning {
		t.Fatalf("after the resume: %v %+v", e.Type, e.Object)
	}
	// Killed while selected: DELETED; a watch without a selector sees
	// every change as it is.
	all := watchFrom(ctx, t, v, WatchOptions{ResourceVersion: v.Current().RV})
	src.Apply(node("n1", 15, other))
	rebuild(t, v)
	if e := recv(t, w); e.Type != watch.Deleted || e.Object.(*sbv1.Sandbox).Name != id("n1", 1) {
		t.Fatalf("after the kill: %v %+v", e.Type, e.Object)
	}
	if e := recv(t, all); e.Type != watch.Deleted || e.Object.(*sbv1.Sandbox).Name != id("n1", 1) {
		t.Fatalf("the watch of all after the kill: %v %+v", e.Type, e.Object)
	}
}

func TestSlowWatcherThatFallsOutOfTheHistoryGetsGone(t *testing.T) {
	src := inventory.NewStaticSource(node("n1", 1))
	v := New(src, Options{History: 2})
	rebuild(t, v)
	w := watchFrom(t.Context(), t, v, WatchOptions{ResourceVersion: v.Current().RV})
	// The watcher reads nothing while five batches pass.
	for i := 1; i <= 5; i++ {
		src.Apply(node("n1", 1+i, entry("n1", i, "a")))
		rebuild(t, v)
	}
	// It may have taken the first events before they fell out; in the end
	// it gets 410 and closes.
	for {
		e := recv(t, w)
		if e.Type == watch.Error {
			st, ok := e.Object.(*metav1.Status)
			if !ok || st.Code != 410 {
				t.Fatalf("error event %+v", e.Object)
			}
			break
		}
	}
}

// Two replicas can make batches of one number from different changes: one
// applied an inventory's two revisions apart, the other together. A
// version inside a batch is then no state of the other replica, and a
// watch from it would skip changes there; it is a 410 on every replica.
// The version at a batch's end, which its last event carries, is the same
// state on both, and a watch from it resumes on either.
func TestAWatchResumesOnAnotherReplicaOnlyFromABatchsEnd(t *testing.T) {
	one, two := entry("n1", 1, "a"), entry("n1", 2, "a")
	srcA := inventory.NewStaticSource(node("n1", 10, one, two))
	srcB := inventory.NewStaticSource(node("n1", 10, one, two))
	a, b := New(srcA, Options{}), New(srcB, Options{})
	rebuild(t, a)
	rebuild(t, b)
	// Revision 15 pauses sandbox 1; replica A rebuilds, B does not.
	paused := one
	paused.State = v1beta1.SandboxPaused
	srcA.Apply(node("n1", 15, paused, two))
	rebuild(t, a)
	srcB.Apply(node("n1", 15, paused, two))
	// Revision 20 kills sandbox 2 and starts 3; both rebuild.
	for _, r := range []struct {
		v   *View
		src *inventory.StaticSource
	}{{a, srcA}, {b, srcB}} {
		r.src.Apply(node("n1", 20, paused, entry("n1", 3, "a")))
		rebuild(t, r.v)
	}
	if a.Current().RV != b.Current().RV {
		t.Fatalf("the replicas number the same state %d and %d", a.Current().RV, b.Current().RV)
	}
	// B's batch 20 is [1 paused, 2 deleted, 3 added], A's [2 deleted, 3
	// added]: after B's first event, A's history would skip the deletion.
	evB, _, _ := b.since(10<<seqBits | snapshotSeq)
	if len(evB) != 3 || evB[0].rv != 20<<seqBits|1 || evB[1].Type != watch.Deleted || evB[2].rv != 20<<seqBits|snapshotSeq {
		t.Fatalf("B's batch 20: %v", evB)
	}
	evA, _, _ := a.since(evB[0].rv)
	if len(evA) != 1 || evA[0].Type != watch.Added {
		t.Fatalf("A's events after B's first of batch 20: %v, want only the ADDED that skips the deletion", evA)
	}
	ctx := t.Context()
	for name, v := range map[string]*View{"A": a, "B": b} {
		if _, err := v.Watch(ctx, WatchOptions{ResourceVersion: evB[0].rv}); !apierrors.IsResourceExpired(err) {
			t.Errorf("%s: a watch from inside batch 20: %v, want 410 Gone", name, err)
		}
		// A watch-list from there asks only for a state at least as new.
		w, err := v.Watch(ctx, WatchOptions{ResourceVersion: evB[0].rv, SendInitialEvents: true})
		if err != nil {
			t.Errorf("%s: a watch-list from inside batch 20: %v", name, err)
		} else {
			w.Stop()
		}
	}
	// From the end of batch 20, where B's last event left its client, A
	// sends the next change.
	w := watchFrom(ctx, t, a, WatchOptions{ResourceVersion: evB[2].rv})
	srcA.Apply(node("n1", 21, paused))
	rebuild(t, a)
	if e := recv(t, w); e.Type != watch.Deleted || e.Object.(*sbv1.Sandbox).Name != id("n1", 3) {
		t.Fatalf("after the end of batch 20: %v %+v", e.Type, e.Object)
	}
}

// A watch with a selector that allows bookmarks, whose last event of a
// batch was not the batch's last, gets a bookmark at the batch's end, so
// that it can resume on any replica; one that does not allow them gets
// nothing more.
func TestAWatchLeftInsideABatchGetsABookmarkAtItsEnd(t *testing.T) {
	src := inventory.NewStaticSource(node("n1", 10))
	v := New(src, Options{})
	rebuild(t, v)
	ctx := t.Context()
	inA := func(sb *sbv1.Sandbox) bool { return sb.Namespace == "a" }
	marks := watchFrom(ctx, t, v, WatchOptions{ResourceVersion: v.Current().RV, Bookmarks: true, BookmarkInterval: time.Hour, Filter: inA})
	plain := watchFrom(ctx, t, v, WatchOptions{ResourceVersion: v.Current().RV, Filter: inA})
	// Batch 11: a's sandbox, then b's (key order).
	src.Apply(node("n1", 11, entry("n1", 1, "a"), entry("n1", 2, "b")))
	rebuild(t, v)
	end := strconv.FormatUint(11<<seqBits|snapshotSeq, 10)
	for name, w := range map[string]watch.Interface{"bookmarks": marks, "plain": plain} {
		if e := recv(t, w); e.Type != watch.Added || e.Object.(*sbv1.Sandbox).ResourceVersion != strconv.FormatUint(11<<seqBits|1, 10) {
			t.Fatalf("%s: %v %+v", name, e.Type, e.Object)
		}
	}
	if e := recv(t, marks); e.Type != watch.Bookmark || e.Object.(*sbv1.Sandbox).ResourceVersion != end {
		t.Fatalf("after a batch whose last event was filtered: %v %+v, want a bookmark at %s", e.Type, e.Object, end)
	}
	// Batch 12 ends with a's sandbox: its event is at the end, and no
	// bookmark follows.
	src.Apply(node("n1", 12, entry("n1", 0, "a"), entry("n1", 1, "a"), entry("n1", 2, "b")))
	rebuild(t, v)
	if e := recv(t, marks); e.Type != watch.Added || e.Object.(*sbv1.Sandbox).ResourceVersion != strconv.FormatUint(12<<seqBits|snapshotSeq, 10) {
		t.Fatalf("batch 12: %v %+v", e.Type, e.Object)
	}
	if e := recv(t, plain); e.Type != watch.Added || e.Object.(*sbv1.Sandbox).Name != id("n1", 0) {
		t.Fatalf("plain, batch 12: %v %+v", e.Type, e.Object)
	}
	select {
	case e := <-marks.ResultChan():
		t.Fatalf("after a batch that ended with the watch's event: %v %+v", e.Type, e.Object)
	case <-time.After(100 * time.Millisecond):
	}
}

// A batch's events are numbered in order after the last batch's end, the
// last at the batch's own end, however many a number must hold: here three
// to a number, so that the spill to the numbers after it shows.
func TestEventsOfABatchAreNumberedInOrder(t *testing.T) {
	const per, batch = 3, 20
	for n := uint64(1); n <= 10; n++ {
		last := uint64((batch-1)<<seqBits | snapshotSeq) // the batch before's end
		perNumber := map[uint64]int{}
		for i := range n {
			rv := eventRV(batch, i, n, per)
			if rv <= last {
				t.Fatalf("n=%d: event %d at %#x, not after %#x", n, i, rv, last)
			}
			last = rv
			seq := rv & snapshotSeq
			if seq == 0 || (seq == snapshotSeq) != (i == n-1) {
				t.Errorf("n=%d: event %d has sequence %#x", n, i, seq)
			}
			perNumber[rv>>seqBits]++
		}
		end := (batch+spill(n, per))<<seqBits | snapshotSeq
		if last != end {
			t.Errorf("n=%d: the last event at %#x, the batch's end at %#x", n, last, end)
		}
		if want := (n + per - 1) / per; uint64(len(perNumber)) != want {
			t.Errorf("n=%d: %d numbers used, want %d", n, len(perNumber), want)
		}
		for b, k := range perNumber {
			if k > per {
				t.Errorf("n=%d: %d events numbered %d", n, k, b)
			}
		}
	}
}
