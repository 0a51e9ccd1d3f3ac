package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// The benchmarks below run the single-host system for real (sandboxd as
// root, the apiserver as its own process) and time the e2b API over HTTP on
// loopback, as an SDK sees it. Each reports p50 and p99 of the timed call
// and, for the concurrent ones, sandboxes per second.

// BenchmarkColdCreate times POST /v2/sandboxes that starts a sandbox cold
// (no warm one exists); the sandbox is killed outside the timing.
func BenchmarkColdCreate(b *testing.B) {
	s := newSystem(b)
	for _, c := range []int{1, 20} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			s.runCreates(b, c, nil)
		})
	}
}

// BenchmarkWarmClaim times POST /v2/sandboxes answered by claiming a warm
// sandbox: before each batch, sandboxd's Warm RPC stocks one warm sandbox
// per create, and the batch waits until the apiserver sees them. cold/op
// counts the creates that found every candidate taken and went cold.
func BenchmarkWarmClaim(b *testing.B) {
	s := newSystem(b)
	client := sandboxdapi.NewClients(s.token, nil)(s.sandboxd)
	stock := func(b *testing.B, n int) int {
		if n == 0 {
			// After a batch: a warm sandbox left means a create went
			// cold (all its candidates were claimed by others first).
			resp, err := client.List(context.Background(), connect.NewRequest(&sandboxdv1.ListRequest{States: []sandboxdv1.SandboxState{sandboxdv1.SandboxState_SANDBOX_STATE_WARM}}))
			if err != nil {
				b.Fatal(err)
			}
			for _, sb := range resp.Msg.GetSandboxes() {
				if _, err := client.Kill(context.Background(), connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: sb.GetId()})); err != nil {
					b.Fatal(err)
				}
			}
			return len(resp.Msg.GetSandboxes())
		}
		for range n {
			if _, err := client.Warm(context.Background(), connect.NewRequest(&sandboxdv1.WarmRequest{Template: "base", Pool: "bench/base"})); err != nil {
				b.Fatalf("warm: %v", err)
			}
		}
		// The inventory (sandboxd's Watch stream) carries them to the
		// apiserver within milliseconds; wait until it has.
		for deadline := time.Now().Add(10 * time.Second); ; {
			resp, err := client.List(context.Background(), connect.NewRequest(&sandboxdv1.ListRequest{States: []sandboxdv1.SandboxState{sandboxdv1.SandboxState_SANDBOX_STATE_WARM}}))
			if err == nil && len(resp.Msg.GetSandboxes()) >= n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("warm sandboxes did not appear")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // the Watch stream to the apiserver
		return 0
	}
	for _, c := range []int{1, 20} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			s.runCreates(b, c, stock)
		})
	}
	// The same claim straight to sandboxd's RPC, without the API: what the
	// e2b API adds is the difference.
	b.Run("sandboxd-rpc/c=1", func(b *testing.B) {
		var lat []time.Duration
		for range b.N {
			b.StopTimer()
			w, err := client.Warm(context.Background(), connect.NewRequest(&sandboxdv1.WarmRequest{Template: "base", Pool: "bench/base"}))
			if err != nil {
				b.Fatal(err)
			}
			id := w.Msg.GetSandbox().GetId()
			b.StartTimer()
			t0 := time.Now()
			if _, err := client.Claim(context.Background(), connect.NewRequest(&sandboxdv1.ClaimRequest{SandboxId: id, Team: "team-a", Timeout: durationpb.New(5 * time.Minute)})); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
			b.StopTimer()
			if _, err := client.Kill(context.Background(), connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		reportLatencies(b, lat)
	})
}

// BenchmarkWarmClaimFromPool times POST /v2/sandboxes answered by a claim
// from a --warm-pool that the apiserver's own driver keeps at 20: before
// each batch it waits until the driver has refilled the pool. cold/op
// counts the creates that went cold all the same.
func BenchmarkWarmClaimFromPool(b *testing.B) {
	const pool = "default/base"
	s := newSystemWith(b, "--warm-pool", "base=20", "--warm-pool-interval", "100ms")
	var (
		before map[string]bool
		batch  int
	)
	refilled := func(b *testing.B, n int) int {
		if n == 0 {
			left, now := 0, s.warmIDs(b, pool)
			for id := range before {
				if now[id] {
					left++
				}
			}
			return max(0, batch-(len(before)-left)) // the batch's creates that claimed none of them
		}
		batch = n
		for deadline := time.Now().Add(60 * time.Second); len(s.warmIDs(b, pool)) < 20; {
			if time.Now().After(deadline) {
				b.Fatal("the driver did not refill the pool to 20 within 60s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // the Watch stream to the apiserver
		before = s.warmIDs(b, pool)
		return 0
	}
	for _, c := range []int{1, 20} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			s.runCreates(b, c, refilled)
		})
	}
}

// runCreates runs b.N creates, c at a time, in batches of c: before each
// batch (outside the timing) prepare(b, c) runs, after it prepare(b, 0),
// which returns how many creates of the batch went cold, then the batch's
// sandboxes are killed. It reports the latency percentiles of the creates
// and creates per second of timed wall time.
func (s *system) runCreates(b *testing.B, c int, prepare func(*testing.B, int) int) {
	var (
		mu        sync.Mutex
		latencies []time.Duration
		wall      time.Duration
		cold      int
	)
	b.ResetTimer()
	b.StopTimer()
	for done := 0; done < b.N; {
		n := min(c, b.N-done)
		if prepare != nil {
			prepare(b, n)
		}
		ids := make([]string, n)
		var wg sync.WaitGroup
		start := time.Now()
		b.StartTimer()
		for i := range n {
			wg.Go(func() {
				t0 := time.Now()
				code, body := s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 300})
				d := time.Since(t0)
				if code != http.StatusCreated {
					b.Errorf("create: %d %s", code, body)
					return
				}
				var sb struct{ SandboxID string }
				_ = json.Unmarshal(body, &sb)
				ids[i] = sb.SandboxID
				mu.Lock()
				latencies = append(latencies, d)
				mu.Unlock()
			})
		}
		wg.Wait()
		b.StopTimer()
		wall += time.Since(start)
		if b.Failed() {
			b.FailNow()
		}
		if prepare != nil {
			cold += prepare(b, 0)
		}
		for _, id := range ids {
			if code, body := s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNoContent {
				b.Fatalf("kill %s: %d %s", id, code, body)
			}
		}
		done += n
	}
	reportLatencies(b, latencies)
	b.ReportMetric(float64(len(latencies))/wall.Seconds(), "creates/s")
	if prepare != nil {
		b.ReportMetric(float64(cold)/float64(len(latencies)), "cold/op")
	}
}

func reportLatencies(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	pct := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(float64(len(d))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op") // the percentiles say it better
}
