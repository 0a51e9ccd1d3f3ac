package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// BenchmarkList2000 times GET /v2/sandboxes over HTTP on loopback for a team
// with 2,000 sandboxes on 4 hosts, through the wiring serve --inventory kube
// runs (newApp) on a real kube-apiserver: the inventories come from the
// informer cache through the freshness filter. page is the SDK's first page
// (limit 100, the most the API gives), page-c20 the same from 20 clients at
// once; all is the whole list, page by page with X-Next-Token.
func BenchmarkList2000(b *testing.B) {
	env := kubetest.Start(b)
	kc := kubetest.WriteKubeconfig(b, env.Config)
	createNamespaces(b, env.Client, "team-a")
	key, _ := keysCreate(b, kc, "team-a")
	now := time.Now()
	for n := range 4 {
		name := fmt.Sprintf("host-%d", n)
		var entries []v1beta1.SandboxEntry
		for i := range 500 {
			id, err := sandboxid.New(sandboxid.NodeTag(name))
			if err != nil {
				b.Fatal(err)
			}
			e := entry(id, "team-a", v1beta1.SandboxRunning)
			e.Metadata = map[string]string{"user": fmt.Sprintf("user-%d", i%50), "purpose": "bench"}
			entries = append(entries, e)
		}
		publish(b, env.Client, name, fmt.Sprintf("127.0.0.1:%d", 27000+n), now, []string{"base"}, entries...)
	}
	token := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(token, []byte("node-token-0123456789\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	o := parseServe(b, "--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", token, "--listen", "127.0.0.1:0")
	app, err := newApp(b.Context(), o, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(app.stop)
	srv := httptest.NewServer(app.handler)
	b.Cleanup(srv.Close)

	fetch := func(path string) ([]byte, string, error) {
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodGet, srv.URL+path, nil)
		req.Header.Set(auth.HeaderAPIKey, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return nil, "", err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, "", fmt.Errorf("GET %s: %w", path, err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, "", fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, body)
		}
		return body, resp.Header.Get("X-Next-Token"), nil
	}
	get := func(path string) ([]byte, string) {
		body, next, err := fetch(path)
		if err != nil {
			b.Fatal(err)
		}
		return body, next
	}
	// The cache has synced once the whole list is there.
	eventually(b, "the 2,000 sandboxes listed", func() bool { return countAll(get) == 2000 })

	b.Run("page", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			t0 := time.Now()
			get("/v2/sandboxes?limit=100")
			lat = append(lat, time.Since(t0))
		}
		reportPercentiles(b, lat)
	})
	b.Run("page-c20", func(b *testing.B) {
		// 20 clients at once: SetParallelism's goroutines per GOMAXPROCS.
		b.SetParallelism(max(1, 20/runtime.GOMAXPROCS(0)))
		var (
			mu  sync.Mutex
			lat []time.Duration
		)
		t0 := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				t1 := time.Now()
				if _, _, err := fetch("/v2/sandboxes?limit=100"); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t1))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
		b.ReportMetric(float64(len(lat))/time.Since(t0).Seconds(), "pages/s")
		reportPercentiles(b, lat)
	})
	b.Run("all", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if n := countAll(get); n != 2000 {
				b.Fatalf("listed %d sandboxes, want 2000", n)
			}
			lat = append(lat, time.Since(t0))
		}
		reportPercentiles(b, lat)
	})
}

// countAll pages through GET /v2/sandboxes and counts the sandboxes.
func countAll(get func(string) ([]byte, string)) int {
	count, next := 0, ""
	for {
		path := "/v2/sandboxes?limit=100"
		if next != "" {
			path += "&nextToken=" + url.QueryEscape(next)
		}
		body, tok := get(path)
		var page []json.RawMessage
		if json.Unmarshal(body, &page) != nil {
			return -1
		}
		count += len(page)
		if tok == "" {
			break
		}
		next = tok
	}
	return count
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	pct := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(float64(len(d))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
