package stats

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// fake is the runtime and the records: sandboxes with their next stats.
type fake struct {
	mu    sync.Mutex
	recs  []*store.Record
	stats map[string]sandboxrt.Stats
	reads int
}

func (f *fake) List() []*store.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*store.Record(nil), f.recs...)
}

func (f *fake) Stats(_ context.Context, id string) (sandboxrt.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	st, ok := f.stats[id]
	if !ok {
		return sandboxrt.Stats{}, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	return st, nil
}

func (f *fake) set(id string, st sandboxrt.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats[id] = st
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestRing(t *testing.T) {
	p := New(&fake{}, &fake{}, clocktesting.NewFakeClock(epoch), 3, quiet())
	for i := range 5 {
		p.add("a", sandboxrt.Stats{Time: epoch.Add(time.Duration(i) * time.Second)})
	}
	p.add("a", sandboxrt.Stats{Time: epoch}) // older than the newest: dropped
	base, got := p.Get("a")
	if len(got) != 3 || base == nil || !base.Time.Equal(epoch.Add(time.Second)) || !got[0].Time.Equal(epoch.Add(2*time.Second)) {
		t.Fatalf("base %v, samples %v", base, got)
	}
	p.retain(map[string]bool{})
	if _, got := p.Get("a"); got != nil {
		t.Fatal("retain kept a forgotten sandbox")
	}
}

// TestRunAndRefresh: Run samples the running sandboxes only and forgets the
// gone ones; Refresh samples unless the newest sample is fresh.
func TestRunAndRefresh(t *testing.T) {
	c := clocktesting.NewFakeClock(epoch)
	f := &fake{stats: map[string]sandboxrt.Stats{}, recs: []*store.Record{
		{ID: "run", State: registry.StateRunning}, {ID: "paused", State: registry.StatePaused},
	}}
	f.set("run", sandboxrt.Stats{Time: epoch.Add(5 * time.Second), CPUUsage: time.Second})
	f.set("paused", sandboxrt.Stats{Time: epoch.Add(5 * time.Second)})
	p := New(f, f, c, 10, quiet())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx, 5*time.Second); close(done) }()
	defer func() { cancel(); <-done }()
	for !c.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	c.Step(5 * time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, s := p.Get("run"); len(s) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sample of the running sandbox")
		}
	}
	if _, s := p.Get("paused"); len(s) != 0 {
		t.Fatalf("paused sandbox sampled: %v", s)
	}

	f.mu.Lock()
	reads := f.reads
	f.mu.Unlock()
	p.Refresh(t.Context(), "run") // the sample is 0 s old: fresh
	f.mu.Lock()
	if f.reads != reads {
		t.Fatalf("Refresh of a fresh sample read the runtime")
	}
	f.mu.Unlock()
	c.Step(time.Second)
	f.set("run", sandboxrt.Stats{Time: c.Now(), CPUUsage: 2 * time.Second})
	p.Refresh(t.Context(), "run")
	if _, s := p.Get("run"); len(s) != 2 {
		t.Fatalf("Refresh of a 1 s old sample: %d samples, want 2", len(s))
	}

	p.Forget("run")
	if _, s := p.Get("run"); s != nil {
		t.Fatalf("Forget kept %v", s)
	}
}
