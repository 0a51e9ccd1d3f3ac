package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/shared/nodetoken"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// snapshotHosts are the runtimes the snapshot benchmarks run on: native
// (files), gVisor keeping memory and processes (the default), and gVisor
// keeping files only (--snapshot-memory=false).
func snapshotHosts(b *testing.B, run func(b *testing.B, h *host)) {
	b.Run("runtime=native", func(b *testing.B) { run(b, newHost(b)) })
	b.Run("runtime=gvisor", func(b *testing.B) {
		run(b, newHost(b, "--runtime", "gvisor", "--runsc", os.Getenv("SKIFF_RUNSC")))
	})
	b.Run("runtime=gvisor-files", func(b *testing.B) {
		run(b, newHost(b, "--runtime", "gvisor", "--runsc", os.Getenv("SKIFF_RUNSC"), "--snapshot-memory=false"))
	})
}

// benchSource is a sandbox with mib MiB written (random, so nothing
// compresses it away), on a disk and with a memory big enough for it.
func benchSource(b *testing.B, h *host, mib int) (id, token string) {
	c := h.create(func(r *sandboxdv1.CreateRequest) {
		r.Resources.DiskMib = int64(2*mib + 512)
		// gVisor copies each file through the sandbox's memory (twice the
		// data must be free, see checkCaptureFits), and a checkpoint
		// leaves the written files' pages in it (once more).
		r.Resources.MemoryMib = int64(3*mib + 512)
	})
	id, token = c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	if mib > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, err := h.envd(id).Run(ctx, "root", token, fmt.Sprintf("mkdir -p /data && dd if=/dev/urandom of=/data/blob bs=1048576 count=%d 2>/dev/null && sync", mib))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("write %d MiB: %+v %v", mib, res, err)
		}
	}
	return id, token
}

// BenchmarkSnapshot is Snapshot of a running sandbox with 10 MiB, 100 MiB
// and 1 GiB written: freeze, copy of the writable layer, sync, thaw,
// record. bytes is what the snapshot holds.
func BenchmarkSnapshot(b *testing.B) {
	snapshotHosts(b, func(b *testing.B, h *host) {
		for _, mib := range []int{10, 100, 1024} {
			b.Run(fmt.Sprintf("written=%dMiB", mib), func(b *testing.B) {
				id, _ := benchSource(b, h, mib)
				ctx := context.Background()
				var took []time.Duration
				var size int64
				for b.Loop() {
					start := time.Now()
					resp, err := h.api.Snapshot(ctx, connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: "team-a"}))
					if err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
					b.StopTimer()
					size = resp.Msg.GetSnapshot().GetSizeBytes()
					if _, err := h.api.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: resp.Msg.GetSnapshot().GetId(), Team: "team-a"})); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				reportPercentiles(b, took)
				b.ReportMetric(float64(size)/(1<<20), "snapshot-MiB")
				if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
					b.Fatal(err)
				}
			})
		}
	})
}

// BenchmarkCreateFromSnapshot is Create of a sandbox from a snapshot of
// one with 100 MiB written: its layers stacked, nothing copied.
func BenchmarkCreateFromSnapshot(b *testing.B) {
	snapshotHosts(b, func(b *testing.B, h *host) {
		ctx := context.Background()
		id, _ := benchSource(b, h, 100)
		snap, err := h.api.Snapshot(ctx, connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: "team-a"}))
		if err != nil {
			b.Fatal(err)
		}
		var took []time.Duration
		for b.Loop() {
			start := time.Now()
			resp, err := h.api.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{
				Snapshot: snap.Msg.GetSnapshot().GetId(), Team: "team-a", Timeout: durationpb.New(time.Hour),
			}))
			if err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
			b.StopTimer()
			if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: resp.Msg.GetSandbox().GetId()})); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		reportPercentiles(b, took)
	})
}

// BenchmarkFork is Fork of a sandbox with 10 MiB written into 1 and 10
// sandboxes: one copy, then the creates one after another.
func BenchmarkFork(b *testing.B) {
	snapshotHosts(b, func(b *testing.B, h *host) {
		ctx := context.Background()
		id, _ := benchSource(b, h, 10)
		for _, count := range []int32{1, 10} {
			b.Run(fmt.Sprintf("count=%d", count), func(b *testing.B) {
				var took []time.Duration
				for b.Loop() {
					start := time.Now()
					resp, err := h.api.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{SandboxId: id, Team: "team-a", Count: count, Timeout: durationpb.New(time.Hour)}))
					if err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
					b.StopTimer()
					for _, f := range resp.Msg.GetForks() {
						if f.GetCreated() == nil {
							b.Fatalf("a fork failed: %s %s", f.GetErrorCode(), f.GetErrorMessage())
						}
						if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: f.GetCreated().GetSandbox().GetId()})); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
				}
				reportPercentiles(b, took)
			})
		}
	})
}

// BenchmarkPull is PullSnapshot of a snapshot of a sandbox with 100 MiB
// written, from one host to another on this machine: manifest, layers and
// (gVisor) image, each verified, synced and put in place.
func BenchmarkPull(b *testing.B) {
	for _, rt := range []string{"native", "gvisor"} {
		b.Run("runtime="+rt, func(b *testing.B) {
			var args []string
			if rt == "gvisor" {
				args = []string{"--runtime", "gvisor", "--runsc", os.Getenv("SKIFF_RUNSC")}
			}
			a, to := newHost(b, args...), newHost(b, args...)
			ctx := context.Background()
			id, _ := benchSource(b, a, 100)
			var took []time.Duration
			var fetched int64
			for b.Loop() {
				b.StopTimer()
				snap, err := a.api.Snapshot(ctx, connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: "team-a"}))
				if err != nil {
					b.Fatal(err)
				}
				sid := snap.Msg.GetSnapshot().GetId()
				b.StartTimer()
				start := time.Now()
				resp, err := a.pull(to, sid, "team-a", nodetoken.PullTicket(a.token, sid, time.Now().Add(time.Minute)))
				if err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				b.StopTimer()
				fetched = resp.GetFetchedBytes()
				for _, h := range []*host{a, to} {
					if _, err := h.api.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: sid, Team: "team-a"})); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
			reportPercentiles(b, took)
			b.ReportMetric(float64(fetched)/(1<<20), "fetched-MiB")
		})
	}
}
