// Package bench measures the whole system as an SDK meets it: one real
// sandbox of the base template, its envd reached through the envd proxy or
// straight through sandboxd's relay.
package bench

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/system"
	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
)

// target is one way to a sandbox's envd: the proxy (what E2B_SANDBOX_URL
// points at) or sandboxd's relay with the node token (what the proxy calls).
type target struct {
	name, base string
	extra      http.Header
}

type sandbox struct {
	id, token string
	targets   []target
	client    *http.Client
}

func newSandbox(b *testing.B) *sandbox {
	sys := systemtest.Start(b, "bench")
	nodeToken, err := sys.NodeToken()
	if err != nil {
		b.Fatal(err)
	}
	sb := create(b, sys)
	sb.targets = []target{
		{"direct", sys.SandboxdURL(), http.Header{"Skiff-Node-Token": {nodeToken}}},
		{"proxy", sys.SandboxURL, http.Header{}},
	}
	sb.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100, DisableCompression: true}}
	return sb
}

func create(b *testing.B, sys *system.System) *sandbox {
	req, _ := http.NewRequest(http.MethodPost, sys.APIURL+"/v2/sandboxes", bytes.NewReader([]byte(`{"templateID":"base","timeout":3600}`)))
	req.Header.Set("X-API-Key", sys.Keys["bench"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ SandboxID, EnvdAccessToken string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusCreated {
		b.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	return &sandbox{id: out.SandboxID, token: out.EnvdAccessToken}
}

// do sends an envd request for the sandbox through t and returns the
// status and the number of body bytes read.
func (s *sandbox) do(t target, method, path string, body io.Reader) (int, int64, error) {
	req, err := http.NewRequest(method, t.base+path, body)
	if err != nil {
		return 0, 0, err
	}
	for k, v := range t.extra {
		req.Header[k] = v
	}
	req.Header.Set("E2b-Sandbox-Id", s.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", s.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, n, err
}

func (s *sandbox) upload(b *testing.B, path string, size int) {
	data := make([]byte, size)
	_, _ = rand.Read(data)
	code, _, err := s.do(s.targets[1], http.MethodPost, "/files?username=user&path="+path, bytes.NewReader(data))
	if err != nil || code != http.StatusOK {
		b.Fatalf("upload %s: %d %v", path, code, err)
	}
}

// BenchmarkEnvdThroughProxy compares the proxy with sandboxd's relay on a
// real sandbox: a 1 KiB file read (GET /files, p50/p99), a 100 MB download
// (MB/s), and 1 KiB reads from 50 concurrent clients (req/s).
func BenchmarkEnvdThroughProxy(b *testing.B) {
	s := newSandbox(b)
	s.upload(b, "/home/user/1k", 1024)
	s.upload(b, "/home/user/100m", 100<<20)
	for _, t := range s.targets {
		b.Run("unary-1KiB/"+t.name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				code, n, err := s.do(t, http.MethodGet, "/files?username=user&path=/home/user/1k", nil)
				if err != nil || code != http.StatusOK || n != 1024 {
					b.Fatalf("read: %d %d %v", code, n, err)
				}
				lat = append(lat, time.Since(t0))
			}
			report(b, lat)
		})
	}
	for _, t := range s.targets {
		b.Run("download-100MB/"+t.name, func(b *testing.B) {
			b.SetBytes(100 << 20)
			for b.Loop() {
				code, n, err := s.do(t, http.MethodGet, "/files?username=user&path=/home/user/100m", nil)
				if err != nil || code != http.StatusOK || n != 100<<20 {
					b.Fatalf("download: %d %d %v", code, n, err)
				}
			}
		})
	}
	for _, t := range s.targets {
		b.Run("c=50/"+t.name, func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range 50 {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if code, _, err := s.do(t, http.MethodGet, "/files?username=user&path=/home/user/1k", nil); err != nil || code != http.StatusOK {
							b.Errorf("read: %d %v", code, err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}

func report(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	pct := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(float64(len(d))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
