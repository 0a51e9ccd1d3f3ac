package e2e

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

func reportPercentiles(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
	b.ReportMetric(ms(took[len(took)*99/100]), "p99-ms")
}

// BenchmarkColdCreate is Create through the API until envd is ready and
// holds its token: network namespace, root, cgroups, envd /health, /init.
//
// For native, "spaced" leaves 250 ms between creates (outside the timing):
// creates at 4/s, below what the host sustains, so each finds the sandbox
// prepared after the one before (--prepared-sandboxes). "back-to-back" has
// no pause, so each create meets the preparing of the next; "unprepared"
// is spaced with --prepared-sandboxes 0: everything in the create.
func BenchmarkColdCreate(b *testing.B) {
	const space = 250 * time.Millisecond
	b.Run("runtime=native/spaced", func(b *testing.B) { benchmarkColdCreate(b, newHost(b), space) })
	b.Run("runtime=native/back-to-back", func(b *testing.B) { benchmarkColdCreate(b, newHost(b), 0) })
	b.Run("runtime=native/unprepared", func(b *testing.B) {
		benchmarkColdCreate(b, newHost(b, "--prepared-sandboxes", "0"), space)
	})
	b.Run("runtime=gvisor", func(b *testing.B) {
		benchmarkColdCreate(b, newHost(b, "--runtime", "gvisor", "--runsc", os.Getenv("SKIFF_RUNSC")), 0)
	})
}

func benchmarkColdCreate(b *testing.B, h *host, space time.Duration) {
	ctx := context.Background()
	var took []time.Duration
	for b.Loop() {
		if space > 0 {
			b.StopTimer()
			time.Sleep(space)
			b.StartTimer()
		}
		start := time.Now()
		resp, err := h.api.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{Template: h.template, Timeout: durationpb.New(time.Hour)}))
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
	reportSteps(b, h, "sandbox started")
}

// reportSteps reports the median of each step of the creates or claims,
// from the durations sandboxd logs with each message.
func reportSteps(b *testing.B, h *host, message string) {
	data, err := os.ReadFile(h.log)
	if err != nil {
		b.Fatal(err)
	}
	steps := map[string][]time.Duration{}
	var lines, prepared int
	for line := range strings.SplitSeq(string(data), "\n") {
		if !strings.Contains(line, message) {
			continue
		}
		lines++
		if strings.Contains(line, " prepared=true") {
			prepared++
		}
		for field := range strings.FieldsSeq(line) {
			k, v, ok := strings.Cut(field, "=")
			if !ok || !slices.Contains([]string{"network", "runtime", "envd", "record", "duration"}, k) {
				continue
			}
			if d, err := time.ParseDuration(v); err == nil {
				steps[k] = append(steps[k], d)
			}
		}
	}
	if message == "sandbox started" && lines > 0 {
		b.ReportMetric(float64(prepared)/float64(lines), "prepared/op")
	}
	for k, ds := range steps {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, k+"-p50-ms")
	}
}

// BenchmarkClaim is Claim of a warm sandbox without environment variables:
// the atomic hand-over, the record, and the token envd was given when the
// sandbox was warmed. Sandboxes are warmed in batches ahead of the claims,
// as a pool has them ready, so a claim does not share the CPUs with the
// start of the sandbox it claims.
func BenchmarkClaim(b *testing.B) {
	h := newHost(b)
	ctx := context.Background()
	const batch = 10
	var (
		took  []time.Duration
		ready []string
	)
	killAll := func(ids []string) {
		for _, id := range ids {
			if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
				b.Fatal(err)
			}
		}
	}
	var claimed []string
	for b.Loop() {
		if len(ready) == 0 {
			b.StopTimer()
			killAll(claimed)
			claimed = claimed[:0]
			for range batch {
				w, err := h.api.Warm(ctx, connect.NewRequest(&sandboxdv1.WarmRequest{Template: h.template, Pool: "ns/bench"}))
				if err != nil {
					b.Fatal(err)
				}
				ready = append(ready, w.Msg.GetSandbox().GetId())
			}
			time.Sleep(200 * time.Millisecond) // the new sandboxes' envds settle
			b.StartTimer()
		}
		id := ready[0]
		ready = ready[1:]
		start := time.Now()
		if _, err := h.api.Claim(ctx, connect.NewRequest(&sandboxdv1.ClaimRequest{SandboxId: id, Team: "t", Timeout: durationpb.New(time.Hour)})); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		claimed = append(claimed, id)
	}
	b.StopTimer()
	killAll(append(claimed, ready...))
	reportPercentiles(b, took)
	reportSteps(b, h, "sandbox claimed")
}

// BenchmarkIdleSandboxMemory starts 200 idle sandboxes and reports what
// each costs the host: the drop in MemAvailable per sandbox (sandbox
// processes, kernel objects, page cache of their layers, sandboxd's records).
func BenchmarkIdleSandboxMemory(b *testing.B) {
	const n = 200
	for b.Loop() {
		b.StopTimer()
		h := newHost(b, "--max-sandboxes", "256")
		ctx := context.Background()
		before := memAvailable(b)
		b.StartTimer()
		for range n {
			if _, err := h.api.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{
				Template: h.template, Timeout: durationpb.New(time.Hour),
				Resources: &sandboxdv1.Resources{CpuMilli: 250, MemoryMib: 128},
			})); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		time.Sleep(2 * time.Second) // let the sandboxes settle into idleness
		after := memAvailable(b)
		b.ReportMetric(float64(before-after)/n/(1<<20), "MiB/sandbox")
		h.cleanup()
		b.StartTimer()
	}
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// BenchmarkGet is the floor of an RPC: Get of a sandbox, through auth, the
// Connect handler and the registry.
func BenchmarkGet(b *testing.B) {
	h := newHost(b)
	ctx := context.Background()
	c := h.create(nil)
	req := connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: c.GetSandbox().GetId()})
	for b.Loop() {
		if _, err := h.api.Get(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommand is one command's round trip in a sandbox through the
// relay: envd's start of it (its fork, its move into the workload cgroup,
// its exec), its output and its end.
func BenchmarkCommand(b *testing.B) {
	h := newHost(b)
	c := h.create(nil)
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	for b.Loop() {
		if got := h.mustRun(id, token, "user", "true"); got.ExitCode != 0 {
			b.Fatalf("true: %+v", got)
		}
	}
}
