package gvisor_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

func reportPercentiles(b *testing.B, took []time.Duration, what string) {
	b.Helper()
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	if what != "" {
		what += "-"
	}
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, what+"p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, what+"p99-ms")
}

// BenchmarkStartToEnvdHealthy is the runtime's part of a cold create: from
// Start to envd answering /health inside the sandbox, through its veth
// (network namespace made beforehand; sandboxd makes it on its side).
func BenchmarkStartToEnvdHealthy(b *testing.B) {
	rt, dir := newRuntime(b)
	ctx := context.Background()
	var took []time.Duration
	for b.Loop() {
		b.StopTimer()
		sandboxNS, clientNS := vethNetns(b)
		spec := newSpec(b, dir, sandboxNS)
		client := newEnvd(clientNS)
		b.StartTimer()
		start := time.Now()
		if err := rt.Start(ctx, spec); err != nil {
			b.Fatal(err)
		}
		client.WaitHealthy(b, 20*time.Second)
		took = append(took, time.Since(start))
		b.StopTimer()
		if err := rt.Stop(ctx, spec.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportPercentiles(b, took, "")
}

// BenchmarkPauseResume is a checkpoint to disk (Pause) and a restore
// until envd answers again (Resume to healthy) of one idle sandbox.
func BenchmarkPauseResume(b *testing.B) {
	rt, dir := newRuntime(b)
	ctx := context.Background()
	sandboxNS, clientNS := vethNetns(b)
	spec := newSpec(b, dir, sandboxNS)
	if err := rt.Start(ctx, spec); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := rt.Stop(ctx, spec.ID); err != nil {
			b.Error(err)
		}
	}()
	client := newEnvd(clientNS)
	client.WaitHealthy(b, 20*time.Second)
	var pause, resume []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := rt.Pause(ctx, spec.ID); err != nil {
			b.Fatal(err)
		}
		pause = append(pause, time.Since(start))
		if st, err := rt.Status(ctx, spec.ID); err != nil || st != sandboxrt.Paused {
			b.Fatalf("status = %v, %v", st, err)
		}
		start = time.Now()
		if err := rt.Resume(ctx, spec.ID); err != nil {
			b.Fatal(err)
		}
		client.WaitHealthy(b, 20*time.Second)
		resume = append(resume, time.Since(start))
	}
	reportPercentiles(b, pause, "pause")
	reportPercentiles(b, resume, "resume")
}
