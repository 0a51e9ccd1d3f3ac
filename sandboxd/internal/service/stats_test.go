package service

import (
	"math"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

func TestToMetrics(t *testing.T) {
	start := epoch
	rec := &store.Record{StartedAt: start, CPUMilli: 1500, MemoryMiB: 512, DiskMiB: 100}
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	samples := []sandboxrt.Stats{
		// 1 CPU-second in 5 s on 2 CPUs (1500m rounds up): 10%.
		{Time: at(5), CPUUsage: time.Second, MemoryUsed: 100 << 20},
		// 9 more CPU-seconds in 5 s: 90%.
		{Time: at(10), CPUUsage: 10 * time.Second, MemoryUsed: 200 << 20, MemoryLimit: 1 << 30, DiskUsed: 7, DiskLimit: 9},
		// More than the CPUs can give (clock skew): capped at 100%.
		{Time: at(11), CPUUsage: 20 * time.Second},
		// A counter that went back (a restarted cgroup): 0%, never negative.
		{Time: at(12), CPUUsage: time.Second},
		// 1/300 of a CPU-second in 1 s on 2 CPUs: 0.1666…%, reported
		// to two places as e2b's envd does.
		{Time: at(13), CPUUsage: time.Second + time.Second/300},
	}
	got := toMetrics(rec, nil, samples)
	want := []struct {
		pct               float64
		memUsed, memTotal int64
		diskUsed, diskTot int64
	}{
		{10, 100 << 20, 512 << 20, 0, 100 << 20},
		{90, 200 << 20, 1 << 30, 7, 9},
		{100, 0, 512 << 20, 0, 100 << 20},
		{0, 0, 512 << 20, 0, 100 << 20},
		{0.17, 0, 512 << 20, 0, 100 << 20},
	}
	if len(got) != len(want) {
		t.Fatalf("%d metrics, want %d", len(got), len(want))
	}
	for i, w := range want {
		m := got[i]
		if m.GetCpuCount() != 2 || math.Abs(m.GetCpuUsedPct()-w.pct) > 1e-9 || m.GetMemUsed() != w.memUsed ||
			m.GetMemTotal() != w.memTotal || m.GetDiskUsed() != w.diskUsed || m.GetDiskTotal() != w.diskTot ||
			!m.GetTimestamp().AsTime().Equal(samples[i].Time) {
			t.Fatalf("metric %d = %v, want %+v", i, m, w)
		}
	}
	// With a baseline (the ring overflowed), the first rate is from it.
	base := &sandboxrt.Stats{Time: at(4), CPUUsage: 0}
	if m := toMetrics(rec, base, samples[:1]); math.Abs(m[0].GetCpuUsedPct()-50) > 1e-9 {
		t.Fatalf("pct from baseline = %v, want 50", m[0].GetCpuUsedPct())
	}
}

func TestMetricsRPC(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create(func(m *pb.CreateRequest) { m.Resources = &pb.Resources{CpuMilli: 1000} }).GetSandbox().GetId()
	get := func() []*pb.SandboxMetric {
		t.Helper()
		resp, err := h.client.Metrics(t.Context(), connect.NewRequest(&pb.MetricsRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetMetrics()
	}
	if got := get(); len(got) != 0 {
		t.Fatalf("metrics without stats = %v", got)
	}
	// The sampler ticks every 5 s on the server's clock; its ticker and the
	// sandbox's deadline wait on it.
	eventually(t, "the sampler's ticker", func() bool { return h.clock.Waiters() >= 2 })
	h.rt.SetStats(id, sandboxrt.Stats{Time: epoch.Add(5 * time.Second), CPUUsage: 2500 * time.Millisecond})
	h.clock.Step(5 * time.Second)
	eventually(t, "a sample", func() bool { _, s := h.svc.samples.Get(id); return len(s) == 1 })
	h.rt.SetStats(id, sandboxrt.Stats{Time: epoch.Add(10 * time.Second), CPUUsage: 3 * time.Second})
	h.clock.Step(5 * time.Second)
	eventually(t, "two samples", func() bool { _, s := h.svc.samples.Get(id); return len(s) == 2 })
	got := get()
	if len(got) != 2 || math.Abs(got[0].GetCpuUsedPct()-50) > 1e-9 || math.Abs(got[1].GetCpuUsedPct()-10) > 1e-9 {
		t.Fatalf("metrics = %v, want 50%% then 10%%", got)
	}
	_, err := h.client.Metrics(t.Context(), connect.NewRequest(&pb.MetricsRequest{SandboxId: "aaaaaaaaaaaaaaaaaaaa"}))
	wantCode(t, err, connect.CodeNotFound)
}
