package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/wire"
)

// The benchmarks run a stand-in sandboxd, the proxy and the client in one
// process on loopback, and compare each proxied measure with the same
// request sent to the stand-in directly.

// benchSetup is a stand-in sandboxd behind the proxy, and a client for each
// path to it.
type benchSetup struct {
	h       *harness
	up      *upstream
	id      string
	direct  *http.Client
	proxied *http.Client
}

func newBenchSetup(b *testing.B, handler http.Handler) *benchSetup {
	b.Helper()
	up := newUpstream(b, "node-a", handler)
	h := newHarness(b, harnessOptions{quiet: true}, up)
	tr := func() *http.Transport {
		return &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true, ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}
	}
	s := &benchSetup{h: h, up: up, id: sandbox(b, "node-a"), direct: &http.Client{Transport: tr()}, proxied: &http.Client{Transport: tr()}}
	b.Cleanup(s.close)
	return s
}

// close ends every server and connection of the setup.
func (s *benchSetup) close() {
	s.direct.CloseIdleConnections()
	s.proxied.CloseIdleConnections()
	s.h.proxy.rp.Transport.(interface{ CloseIdleConnections() }).CloseIdleConnections()
	s.h.srv.Close()
	s.up.Close()
}

// request builds a request for the sandbox, to the proxy or straight to
// the stand-in (with the headers the proxy would add).
func (s *benchSetup) request(ctx context.Context, viaProxy bool, method, path string, body io.Reader) *http.Request {
	base := s.up.URL
	if viaProxy {
		base = s.h.srv.URL
	}
	req, _ := http.NewRequestWithContext(ctx, method, base+path, body)
	req.Header.Set("E2b-Sandbox-Id", s.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", "bench-token")
	req.Header.Set("Content-Type", "application/json")
	if !viaProxy {
		req.Header.Set(wire.NodeTokenHeader, nodeToken)
	}
	return req
}

func (s *benchSetup) client(viaProxy bool) *http.Client {
	if viaProxy {
		return s.proxied
	}
	return s.direct
}

// roundTrip sends one request and drains the answer.
func (s *benchSetup) roundTrip(b *testing.B, viaProxy bool, method, path string, body []byte) int64 {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	resp, err := s.client(viaProxy).Do(s.request(b.Context(), viaProxy, method, path, r))
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	return n
}

// echo1KB answers a unary call with 1 KiB, as envd's small RPCs do.
var echo1KB = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(kib)
})

var kib = []byte(`{"entries":"` + strings.Repeat("x", 1024-15) + `"}`)

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkAddedLatency1KB: a 1 KiB unary request (1 KiB answer), sent
// alternately straight to sandboxd and through the proxy, one at a time on
// warm keep-alive connections. Reports the p50 and p99 of each and what the
// proxy adds.
func BenchmarkAddedLatency1KB(b *testing.B) {
	s := newBenchSetup(b, echo1KB)
	var direct, proxied []time.Duration
	s.roundTrip(b, false, http.MethodPost, "/process.Process/List", kib) // warm the connections
	s.roundTrip(b, true, http.MethodPost, "/process.Process/List", kib)
	for b.Loop() {
		t0 := time.Now()
		s.roundTrip(b, false, http.MethodPost, "/process.Process/List", kib)
		t1 := time.Now()
		s.roundTrip(b, true, http.MethodPost, "/process.Process/List", kib)
		direct, proxied = append(direct, t1.Sub(t0)), append(proxied, time.Since(t1))
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50", .50}, {"p99", .99}} {
		d, pr := percentile(direct, p.q), percentile(proxied, p.q)
		b.ReportMetric(us(d), "direct-"+p.name+"-µs")
		b.ReportMetric(us(pr), "proxied-"+p.name+"-µs")
		b.ReportMetric(us(pr-d), "added-"+p.name+"-µs")
	}
}

// BenchmarkDownload100MB: a 100 MB download (envd's GET /files), straight
// and through the proxy, alternately. Reports each throughput and the
// ratio proxied/direct.
func BenchmarkDownload100MB(b *testing.B) {
	const size = 100 << 20
	block := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	s := newBenchSetup(b, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		for range size / len(block) {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
	}))
	var direct, proxied time.Duration
	b.SetBytes(2 * size)
	for b.Loop() {
		t0 := time.Now()
		if n := s.roundTrip(b, false, http.MethodGet, "/files?path=%2Fbig", nil); n != size {
			b.Fatalf("direct: %d bytes", n)
		}
		t1 := time.Now()
		if n := s.roundTrip(b, true, http.MethodGet, "/files?path=%2Fbig", nil); n != size {
			b.Fatalf("proxied: %d bytes", n)
		}
		direct, proxied = direct+t1.Sub(t0), proxied+time.Since(t1)
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * size / (1 << 20) / d.Seconds() }
	b.ReportMetric(mbps(direct), "direct-MiB/s")
	b.ReportMetric(mbps(proxied), "proxied-MiB/s")
	b.ReportMetric(mbps(proxied)/mbps(direct), "ratio")
}

// BenchmarkRequestsPerSecondC50: 1 KiB unary requests from 50 concurrent
// clients.
func BenchmarkRequestsPerSecondC50(b *testing.B) {
	for _, viaProxy := range []bool{false, true} {
		name := "direct"
		if viaProxy {
			name = "proxied"
		}
		b.Run(name, func(b *testing.B) {
			s := newBenchSetup(b, echo1KB)
			b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					s.roundTrip(b, viaProxy, http.MethodPost, "/process.Process/List", kib)
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}

// BenchmarkMemoryPerOpenStream: heap and goroutines per open stream (a
// Connect server stream that has sent its first message and waits), as what
// 500 streams through the proxy cost beyond the same 500 streams sent
// straight to sandboxd. The difference is the proxy's own cost.
func BenchmarkMemoryPerOpenStream(b *testing.B) {
	const streams = 500
	for b.Loop() {
		var heap, routines [2]float64
		for i, viaProxy := range []bool{false, true} {
			heap[i], routines[i] = openStreams(b, viaProxy, streams)
		}
		b.ReportMetric((heap[1]-heap[0])/streams, "heap-B/stream")
		b.ReportMetric((routines[1]-routines[0])/streams, "goroutines/stream")
	}
}

// openStreams opens n streams, measures the heap in use and the goroutines
// with all of them open, then ends them.
func openStreams(b *testing.B, viaProxy bool, n int) (heap, goroutines float64) {
	release := make(chan struct{})
	s := newBenchSetup(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		_, _ = io.WriteString(w, "started\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	s.client(viaProxy).Transport.(*http.Transport).MaxIdleConnsPerHost = n
	var wg sync.WaitGroup
	opened := make(chan error, n)
	var bodies []io.ReadCloser
	var mu sync.Mutex
	for range n {
		wg.Go(func() {
			//nolint:bodyclose // kept open until every stream is, then closed below.
			resp, err := s.client(viaProxy).Do(s.request(b.Context(), viaProxy, http.MethodPost, "/process.Process/Start", strings.NewReader("{}")))
			if err != nil {
				opened <- err
				return
			}
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err == nil && line != "started\n" {
				err = io.ErrUnexpectedEOF
			}
			mu.Lock()
			bodies = append(bodies, resp.Body)
			mu.Unlock()
			opened <- err
		})
	}
	for range n {
		if err := <-opened; err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap, goroutines = float64(ms.HeapInuse), float64(runtime.NumGoroutine())
	close(release)
	for _, body := range bodies {
		_, _ = io.Copy(io.Discard, body)
		_ = body.Close()
	}
	wg.Wait()
	s.close() // so the next measure starts from nothing of this one
	return heap, goroutines
}
