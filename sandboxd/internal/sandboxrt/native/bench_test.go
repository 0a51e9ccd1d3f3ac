package native_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// BenchmarkStartToEnvdHealthy is the runtime's part of a cold create: from
// Start to envd answering /health inside the sandbox (network namespace
// made beforehand; sandboxd makes it on its side).
func BenchmarkStartToEnvdHealthy(b *testing.B) {
	rt, dir := newRuntime(b)
	rootfs, envd := sandboxtest.BusyboxRootfs(b), sandboxtest.EnvdBinary(b)
	ctx := context.Background()
	var took []time.Duration
	for b.Loop() {
		b.StopTimer()
		ns := sandboxtest.Netns(b)
		id, _ := sandboxid.New(sandboxid.NodeTag("bench"))
		client := sandboxtest.NewEnvd("http://127.0.0.1:49983", sandboxtest.NetnsDialer(ns))
		b.StartTimer()
		start := time.Now()
		if err := rt.Start(ctx, &sandboxrt.Spec{
			ID: id, Rootfs: rootfs, CPUMilli: 2000, MemoryMiB: 512, NetNS: ns, Hostname: "bench",
			Envd: envd, EnvdArgs: []string{"--port", "49983"}, Log: filepath.Join(dir, id+".log"),
		}); err != nil {
			b.Fatal(err)
		}
		client.WaitHealthy(b, 10*time.Second)
		took = append(took, time.Since(start))
		b.StopTimer()
		if err := rt.Stop(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkStatsOf100kFiles is one Stats of a sandbox that has written
// 100,000 files: the disk's use comes from its filesystem, not from a walk
// of the files (which cost 30 % of a core, sampled every 5 s, with 300k).
func BenchmarkStatsOf100kFiles(b *testing.B) {
	rt, dir := newRuntime(b)
	ns := sandboxtest.Netns(b)
	id, _ := sandboxid.New(sandboxid.NodeTag("bench"))
	ctx := context.Background()
	if err := rt.Start(ctx, &sandboxrt.Spec{
		ID: id, Rootfs: sandboxtest.BusyboxRootfs(b), CPUMilli: 2000, MemoryMiB: 512, DiskMiB: 10240, NetNS: ns, Hostname: "bench",
		Envd: sandboxtest.EnvdBinary(b), EnvdArgs: []string{"--port", "49983"}, Log: filepath.Join(dir, id+".log"),
	}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = rt.Stop(ctx, id) }()
	client := sandboxtest.NewEnvd("http://127.0.0.1:49983", sandboxtest.NetnsDialer(ns))
	client.WaitHealthy(b, 10*time.Second)
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := client.Run(runCtx, "user", "", "mkdir -p /home/user/many && cd /home/user/many && for d in $(seq 100); do mkdir $d; (cd $d && seq 1000 | xargs touch); done"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		st, err := rt.Stats(ctx, id)
		if err != nil || st.DiskUsed <= 0 {
			b.Fatalf("stats %+v, %v", st, err)
		}
	}
}
