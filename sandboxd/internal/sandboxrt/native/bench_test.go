package native_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// BenchmarkStartToEnvdHealthy is the runtime's part of a cold create: from
// Start to envd answering /health inside the sandbox (network namespace
// made beforehand; sandboxd makes it on its side).
func BenchmarkStartToEnvdHealthy(b *testing.B) {
	sandboxtest.RequireRoot(b)
	dir := sandboxtest.Dir(b)
	opts := native.DefaultOptions(filepath.Join(dir, "native"))
	opts.CgroupParent = sandboxtest.CgroupParent(b)
	rt, err := native.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
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
