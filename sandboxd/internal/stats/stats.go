// Package stats samples the resource use of every running sandbox and
// keeps each one's last samples, for the Metrics RPC. CPU use is a rate,
// so a sandbox needs two samples (or one and its start) to have one.
package stats

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/utils/clock"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
)

// freshSample is how old the newest sample may be before Refresh takes one
// of its own.
const freshSample = time.Second

// Runtime reads a sandbox's resource use.
type Runtime interface {
	Stats(ctx context.Context, id string) (sandboxrt.Stats, error)
}

// Records lists the host's sandboxes (the registry).
type Records interface {
	List() []*store.Record
}

// Sampler keeps the last samples of every running sandbox.
type Sampler struct {
	rt      Runtime
	records Records
	clock   clock.WithTicker
	log     *slog.Logger
	size    int
	// inflight makes concurrent samples of one sandbox one sample.
	inflight singleflight.Group

	mu    sync.Mutex
	rings map[string]*ring
}

type ring struct {
	// base is the sample before the oldest kept one, the baseline of the
	// first rate; nil until the ring first overflows.
	base    *sandboxrt.Stats
	samples []sandboxrt.Stats
}

// New returns a sampler that keeps size samples of each sandbox (at least
// two), read from rt.
func New(rt Runtime, records Records, c clock.WithTicker, size int, log *slog.Logger) *Sampler {
	return &Sampler{rt: rt, records: records, clock: c, log: log, size: max(size, 2), rings: map[string]*ring{}}
}

// Run samples every running sandbox each interval until ctx ends, and
// forgets the sandboxes that are gone.
func (p *Sampler) Run(ctx context.Context, interval time.Duration) {
	t := p.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			p.sampleAll(ctx)
		}
	}
}

// Refresh samples sandbox id unless its newest sample is at most a second
// old: what a Metrics call of a running sandbox does first.
func (p *Sampler) Refresh(ctx context.Context, id string) {
	_, samples := p.Get(id)
	if n := len(samples); n == 0 || p.clock.Since(samples[n-1].Time) >= freshSample {
		p.sampleOne(ctx, id)
	}
}

// Get returns the baseline (nil: the sandbox's start) and the samples,
// oldest first.
func (p *Sampler) Get(id string) (*sandboxrt.Stats, []sandboxrt.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rings[id]
	if r == nil {
		return nil, nil
	}
	var base *sandboxrt.Stats
	if r.base != nil {
		b := *r.base
		base = &b
	}
	return base, append([]sandboxrt.Stats(nil), r.samples...)
}

// Forget drops the samples of sandbox id.
func (p *Sampler) Forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.rings, id)
}

// add keeps st, unless it is not newer than the last sample (a Metrics
// call and the sampler can race).
func (p *Sampler) add(id string, st sandboxrt.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rings[id]
	if r == nil {
		r = &ring{}
		p.rings[id] = r
	}
	if n := len(r.samples); n > 0 && !st.Time.After(r.samples[n-1].Time) {
		return
	}
	if len(r.samples) == p.size {
		oldest := r.samples[0]
		r.base = &oldest
		r.samples = append(r.samples[:0], r.samples[1:]...)
	}
	r.samples = append(r.samples, st)
}

// retain forgets every sandbox not in keep.
func (p *Sampler) retain(keep map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.rings {
		if !keep[id] {
			delete(p.rings, id)
		}
	}
}

// sampleAll takes one sample of every running sandbox.
func (p *Sampler) sampleAll(ctx context.Context) {
	keep := map[string]bool{}
	for _, rec := range p.records.List() {
		keep[rec.ID] = true
		if rec.State == registry.StateRunning {
			p.sampleOne(ctx, rec.ID)
		}
	}
	p.retain(keep)
}

// sampleOne samples sandbox id once, or waits for the sample being taken
// (ten Metrics calls at once take one sample, not ten).
func (p *Sampler) sampleOne(ctx context.Context, id string) {
	_, _, _ = p.inflight.Do(id, func() (any, error) {
		p.sampleNow(ctx, id)
		return nil, nil
	})
}

func (p *Sampler) sampleNow(ctx context.Context, id string) {
	st, err := p.rt.Stats(ctx, id)
	if err != nil {
		p.log.DebugContext(ctx, "sample sandbox", "sandbox", id, "error", err)
		return
	}
	if st.Time.IsZero() {
		st.Time = p.clock.Now()
	}
	p.add(id, st)
}
