package server

import (
	"context"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/singleflight"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// freshSample is how old the newest sample may be before a Metrics call
// takes one of its own.
const freshSample = time.Second

// sampler keeps the last samples of every running sandbox's resource use:
// CPU use is a rate, so it needs two samples.
type sampler struct {
	size int
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

func newSampler(size int) *sampler {
	return &sampler{size: max(size, 2), rings: map[string]*ring{}}
}

// add keeps st, unless it is not newer than the last sample (a Metrics
// call and the sampler can race).
func (p *sampler) add(id string, st sandboxrt.Stats) {
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

// get returns the baseline (nil: the sandbox's start) and the samples.
func (p *sampler) get(id string) (*sandboxrt.Stats, []sandboxrt.Stats) {
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

func (p *sampler) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.rings, id)
}

// retain forgets every sandbox not in keep.
func (p *sampler) retain(keep map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.rings {
		if !keep[id] {
			delete(p.rings, id)
		}
	}
}

// runSampler samples every running sandbox each --metrics-interval until
// ctx ends.
func (s *Server) runSampler(ctx context.Context) {
	t := s.clock.NewTicker(s.opts.MetricsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.sampleAll(ctx)
		}
	}
}

// sampleAll takes one sample of every running sandbox.
func (s *Server) sampleAll(ctx context.Context) {
	keep := map[string]bool{}
	for _, rec := range s.reg.List() {
		keep[rec.ID] = true
		if rec.State == registry.StateRunning {
			s.sampleOne(ctx, rec.ID)
		}
	}
	s.samples.retain(keep)
}

// sampleOne samples sandbox id once, or waits for the sample being taken
// (ten Metrics calls at once take one sample, not ten).
func (s *Server) sampleOne(ctx context.Context, id string) {
	_, _, _ = s.samples.inflight.Do(id, func() (any, error) {
		s.sampleNow(ctx, id)
		return nil, nil
	})
}

func (s *Server) sampleNow(ctx context.Context, id string) {
	st, err := s.rt.Stats(ctx, id)
	if err != nil {
		s.log.DebugContext(ctx, "sample sandbox", "sandbox", id, "error", err)
		return
	}
	if st.Time.IsZero() {
		st.Time = s.clock.Now()
	}
	s.samples.add(id, st)
}

// Metrics returns the sandbox's recent resource use, one point per sample,
// in e2b's SandboxMetric terms; the newest is at most a second old for a
// running sandbox.
func (s *Server) Metrics(ctx context.Context, req *connect.Request[pb.MetricsRequest]) (*connect.Response[pb.MetricsResponse], error) {
	id := req.Msg.GetSandboxId()
	if err := validID(id); err != nil {
		return nil, err
	}
	rec, err := s.reg.Get(id)
	if err != nil {
		return nil, toConnect(err)
	}
	if rec.State == registry.StateRunning {
		_, samples := s.samples.get(id)
		if n := len(samples); n == 0 || s.clock.Since(samples[n-1].Time) >= freshSample {
			s.sampleOne(ctx, id)
		}
	}
	base, samples := s.samples.get(id)
	return connect.NewResponse(&pb.MetricsResponse{Metrics: toMetrics(rec, base, samples)}), nil
}

// toMetrics turns samples into e2b's SandboxMetric points. CPU use is the
// CPU time between a sample and the one before it (the first one: the
// sandbox's start) over the wall time between them, as a percentage of the
// sandbox's CPUs (cpu_count, its millicores rounded up).
func toMetrics(rec *store.Record, base *sandboxrt.Stats, samples []sandboxrt.Stats) []*pb.SandboxMetric {
	cpus := max((rec.CPUMilli+999)/1000, 1)
	prev := sandboxrt.Stats{Time: rec.StartedAt}
	if base != nil {
		prev = *base
	}
	out := make([]*pb.SandboxMetric, 0, len(samples))
	for _, st := range samples {
		pct := 0.0
		if dt := st.Time.Sub(prev.Time); dt > 0 {
			pct = float64(st.CPUUsage-prev.CPUUsage) / float64(dt) / float64(cpus) * 100
			pct = min(max(pct, 0), 100)
		}
		m := &pb.SandboxMetric{
			Timestamp:  timestamppb.New(st.Time),
			CpuCount:   int32(cpus),
			CpuUsedPct: pct,
			MemUsed:    st.MemoryUsed,
			MemTotal:   st.MemoryLimit,
			DiskUsed:   st.DiskUsed,
			DiskTotal:  st.DiskLimit,
		}
		if m.MemTotal <= 0 {
			m.MemTotal = rec.MemoryMiB << 20
		}
		if m.DiskTotal <= 0 {
			m.DiskTotal = rec.DiskMiB << 20
		}
		out = append(out, m)
		prev = st
	}
	return out
}
