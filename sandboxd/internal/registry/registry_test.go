package registry

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

var tag = sandboxid.NodeTag("node-1")

func open(t *testing.T, dir string, limits Limits) *Registry {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(st, limits)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func addSandbox(t *testing.T, r *Registry, state, pool string, cpu, mem int64) *store.Record {
	t.Helper()
	id, err := sandboxid.New(tag)
	if err != nil {
		t.Fatal(err)
	}
	v, err := r.Reserve(cpu, mem)
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	rec := &store.Record{ID: id, Template: "base", Pool: pool, State: state, CPUMilli: cpu, MemoryMiB: mem, StartedAt: time.Now()}
	if err := r.Add(v, rec); err != nil {
		t.Fatalf("Add: %v", err)
	}
	return rec
}

func TestCapacity(t *testing.T) {
	r := open(t, t.TempDir(), Limits{MaxSandboxes: 3, CPUMilli: 4000, MemoryMiB: 2048})
	addSandbox(t, r, StateRunning, "", 2000, 512)
	v, err := r.Reserve(2000, 512)
	if err != nil {
		t.Fatalf("second Reserve: %v", err)
	}
	// CPU is now full, counting the pending reservation.
	if _, err := r.Reserve(1, 1); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Reserve over CPU = %v, want ErrExhausted", err)
	}
	v.Release()
	v.Release() // twice is harmless
	if got := r.Usage(); got != (Usage{1, 2000, 512}) {
		t.Fatalf("usage after release = %+v", got)
	}
	if _, err := r.Reserve(1000, 2000); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Reserve over memory = %v, want ErrExhausted", err)
	}
	addSandbox(t, r, StateRunning, "", 100, 100)
	addSandbox(t, r, StateRunning, "", 100, 100)
	_, err = r.Reserve(1, 1)
	if !errors.Is(err, ErrExhausted) || err.Error() != "host is full: no room for sandboxes (4 of 3)" {
		t.Fatalf("Reserve over the sandbox count = %v", err)
	}
}

// With CPU shared, sandboxes' vCPUs together pass the host's CPU; memory
// and the count still bind.
func TestCapacitySharedCPU(t *testing.T) {
	r := open(t, t.TempDir(), Limits{MaxSandboxes: 3, CPUMilli: 2000, CPUShared: true, MemoryMiB: 1024})
	addSandbox(t, r, StateRunning, "", 8000, 512)
	if _, err := r.Reserve(8000, 256); err != nil {
		t.Fatalf("Reserve past the host's CPU, shared: %v", err)
	}
	if _, err := r.Reserve(1, 512); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "memory") || strings.Contains(err.Error(), "cpu") {
		t.Fatalf("Reserve over memory = %v, want ErrExhausted for memory only", err)
	}
}

// 100 concurrent claims on 10 warm sandboxes: exactly 10 win, each sandbox
// once; 100 claims of one sandbox: exactly one wins.
func TestConcurrentClaims(t *testing.T) {
	r := open(t, t.TempDir(), Limits{MaxSandboxes: 100, CPUMilli: 1e6, MemoryMiB: 1e6})
	for range 10 {
		addSandbox(t, r, StateWarm, "team/base", 1000, 512)
	}
	var mu sync.Mutex
	won := map[string]int{}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			rec, err := r.ClaimAny("team/base", "", func(rec *store.Record) error {
				rec.Team = fmt.Sprintf("team-%d", i)
				return nil
			})
			if err != nil {
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("ClaimAny: %v", err)
				}
				return
			}
			mu.Lock()
			won[rec.ID]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(won) != 10 {
		t.Fatalf("%d sandboxes claimed, want 10", len(won))
	}
	for id, n := range won {
		if n != 1 {
			t.Fatalf("sandbox %s claimed %d times", id, n)
		}
		if rec, _ := r.Get(id); rec.State != StateRunning || rec.Team == "" {
			t.Fatalf("claimed sandbox = %+v, want running with a team", rec)
		}
	}

	one := addSandbox(t, r, StateWarm, "team/base", 1000, 512)
	var wins, conflicts int
	for range 100 {
		wg.Go(func() {
			_, err := r.Claim(one.ID, func(*store.Record) error { return nil })
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, ErrNotWarm):
				conflicts++
			default:
				t.Errorf("Claim: %v", err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || conflicts != 99 {
		t.Fatalf("claims of one sandbox: %d won, %d conflicts; want 1 and 99", wins, conflicts)
	}
}

// Every change is in the store before it is visible, and a failed change
// leaves nothing behind: a reopened registry sees exactly what was shown.
func TestDurableChanges(t *testing.T) {
	dir := t.TempDir()
	limits := Limits{MaxSandboxes: 10, CPUMilli: 1e5, MemoryMiB: 1e5}
	r := open(t, dir, limits)
	a := addSandbox(t, r, StateRunning, "", 1000, 512)
	b := addSandbox(t, r, StateWarm, "p/q", 1000, 512)
	if _, err := r.Update(a.ID, func(rec *store.Record) error { rec.State = StatePaused; return nil }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := r.Update(a.ID, func(rec *store.Record) error { rec.State = "broken"; return boom }); !errors.Is(err, boom) {
		t.Fatalf("Update = %v, want boom", err)
	}
	if err := r.Add(&Reservation{r: r}, &store.Record{ID: a.ID}); !errors.Is(err, ErrExists) {
		t.Fatalf("Add of a taken ID = %v, want ErrExists", err)
	}
	if err := r.Remove(b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Update(b.ID, func(*store.Record) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update of a removed sandbox = %v, want ErrNotFound", err)
	}

	again := open(t, dir, limits)
	list := again.List()
	if len(list) != 1 || list[0].ID != a.ID || list[0].State != StatePaused {
		t.Fatalf("reopened = %+v, want a, paused", list)
	}
	if got := again.Usage(); got != (Usage{1, 1000, 512}) {
		t.Fatalf("reopened usage = %+v", got)
	}
}
