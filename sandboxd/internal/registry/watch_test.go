package registry

import (
	"sync"
	"testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/store"
)

func TestWatch(t *testing.T) {
	r := open(t, t.TempDir(), Limits{MaxSandboxes: 10, CPUMilli: 1e5, MemoryMiB: 1e5})
	a := addSandbox(t, r, StateWarm, "p/q", 100, 100)

	snap, events, stop := r.Watch()
	defer stop()
	if len(snap) != 1 || snap[0].ID != a.ID {
		t.Fatalf("snapshot = %+v, want a", snap)
	}
	b := addSandbox(t, r, StateRunning, "", 100, 100)
	if _, err := r.Claim(a.ID, func(rec *store.Record) error { rec.Team = "t"; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(b.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove("notthere0000000000aa"); err != nil { // unknown: no event
		t.Fatal(err)
	}
	want := []struct {
		typ   EventType
		id    string
		state string
	}{{Upserted, b.ID, StateRunning}, {Upserted, a.ID, StateRunning}, {Deleted, b.ID, StateRunning}}
	for i, w := range want {
		ev := <-events
		if ev.Type != w.typ || ev.Record.ID != w.id || ev.Record.State != w.state {
			t.Fatalf("event %d = %v %s %s, want %v %s %s", i, ev.Type, ev.Record.ID, ev.Record.State, w.typ, w.id, w.state)
		}
	}
	select {
	case ev := <-events:
		t.Fatalf("unexpected event %+v", ev)
	default:
	}
	stop()
	stop() // twice is harmless
	if _, ok := <-events; ok {
		t.Fatal("events still open after stop")
	}
}

// Changes racing with Watch land either in the snapshot or in the events,
// never in neither.
func TestWatchMissesNothing(t *testing.T) {
	r := open(t, t.TempDir(), Limits{MaxSandboxes: 1000, CPUMilli: 1e6, MemoryMiB: 1e6})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 200 {
			addSandbox(t, r, StateRunning, "", 1, 1)
		}
	})
	snap, events, stop := r.Watch()
	defer stop()
	wg.Wait()
	seen := map[string]bool{}
	for _, rec := range snap {
		seen[rec.ID] = true
	}
	for len(seen) < 200 {
		ev, ok := <-events
		if !ok {
			t.Fatal("events closed")
		}
		if seen[ev.Record.ID] {
			t.Fatalf("%s both in the snapshot and as an event", ev.Record.ID)
		}
		seen[ev.Record.ID] = true
	}
}

func TestSlowWatcherIsDropped(t *testing.T) {
	r := open(t, t.TempDir(), Limits{MaxSandboxes: WatchBuffer + 10, CPUMilli: 1e9, MemoryMiB: 1e9})
	_, events, stop := r.Watch()
	defer stop()
	for range WatchBuffer + 1 {
		addSandbox(t, r, StateRunning, "", 1, 1)
	}
	n := 0
	for range events {
		n++
	}
	if n != WatchBuffer {
		t.Fatalf("read %d events before the channel closed, want %d", n, WatchBuffer)
	}
	snap, _, stop2 := r.Watch() // watching again starts from a fresh snapshot
	defer stop2()
	if len(snap) != WatchBuffer+1 {
		t.Fatalf("fresh snapshot has %d sandboxes, want %d", len(snap), WatchBuffer+1)
	}
}
