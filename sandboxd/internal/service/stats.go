package service

import (
	"context"
	"math"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Metrics returns the sandbox's recent resource use, one point per sample,
// in e2b's SandboxMetric terms; the newest is at most a second old for a
// running sandbox.
func (s *Service) Metrics(ctx context.Context, req *connect.Request[pb.MetricsRequest]) (*connect.Response[pb.MetricsResponse], error) {
	id := req.Msg.GetSandboxId()
	if err := validID(id); err != nil {
		return nil, err
	}
	rec, err := s.reg.Get(id)
	if err != nil {
		return nil, toConnect(err)
	}
	if rec.State == registry.StateRunning {
		s.samples.Refresh(ctx, id)
	}
	base, samples := s.samples.Get(id)
	return connect.NewResponse(&pb.MetricsResponse{Metrics: toMetrics(rec, base, samples)}), nil
}

// toMetrics turns samples into e2b's SandboxMetric points. CPU use is the
// CPU time between a sample and the one before it (the first one: the
// sandbox's start) over the wall time between them, as a percentage of the
// sandbox's CPUs (cpu_count, its millicores rounded up), to two decimal
// places.
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
			// Two decimal places, as e2b's envd reports it.
			pct = math.Round(min(max(pct, 0), 100)*100) / 100
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
