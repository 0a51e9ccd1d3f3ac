package cli

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// BenchmarkAggregatedList times lists of sandboxes the way kubectl and
// client-go make them: through the kube-apiserver's aggregation layer to
// the aggregated API that serve --inventory kube runs (newApp), over 20
// published inventories of 2,000 sandboxes each. page-500 is one page of
// 500 (kubectl's chunk size) across namespaces; all-chunked is the whole
// 40,000 page by page, as kubectl get -A fetches them. rss-MiB is this
// process's resident memory afterwards (the server, its informer cache,
// and the benchmark's client).
func BenchmarkAggregatedList(b *testing.B) {
	env := kubetest.StartWith(b, kubetest.Options{Aggregator: true})
	kc := kubetest.WriteKubeconfig(b, env.Config)
	now := time.Now()
	for n := range 20 {
		name := fmt.Sprintf("host-%02d", n)
		entries := make([]v1beta1.SandboxEntry, 0, 2000)
		for i := range 2000 {
			id, err := sandboxid.New(sandboxid.NodeTag(name))
			if err != nil {
				b.Fatal(err)
			}
			e := entry(id, fmt.Sprintf("team-%02d", i%50), v1beta1.SandboxRunning)
			e.Metadata = map[string]string{"user": fmt.Sprintf("user-%d", i%50), "purpose": "bench"}
			entries = append(entries, e)
		}
		publish(b, env.Client, name, fmt.Sprintf("127.0.0.1:%d", 27000+n), now, []string{"base"}, entries...)
	}
	args := installKubeAPI(b, env)
	token := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(token, []byte("node-token-0123456789\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	o := parseServe(b, append([]string{"--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", token, "--listen", "127.0.0.1:0"}, args...)...)
	app, err := newApp(b.Context(), o, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = app.kubeAPI.server.Run(ctx) })
	b.Cleanup(func() { cancel(); wg.Wait(); app.stop() })
	waitCtx, cancelWait := context.WithTimeout(b.Context(), time.Minute)
	defer cancelWait()
	if err := deploy.WaitAvailable(waitCtx, deployClient(b, env)); err != nil {
		b.Fatal(err)
	}
	res := dynamic.NewForConfigOrDie(env.Config).Resource(sbv1.GroupVersion.WithResource("sandboxes"))
	list := func(limit int64, cont string) (int, string) {
		l, err := res.List(b.Context(), metav1.ListOptions{Limit: limit, Continue: cont})
		if err != nil {
			b.Fatal(err)
		}
		return len(l.Items), l.GetContinue()
	}
	all := func() int {
		n, cont := 0, ""
		for {
			got, next := list(500, cont)
			n += got
			if cont = next; cont == "" {
				return n
			}
		}
	}
	eventually(b, "the 40,000 sandboxes listed", func() bool { return all() == 40000 })

	b.Run("page-500", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if n, _ := list(500, ""); n != 500 {
				b.Fatalf("a page of %d", n)
			}
			lat = append(lat, time.Since(t0))
		}
		reportPercentiles(b, lat)
	})
	b.Run("all-chunked", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if n := all(); n != 40000 {
				b.Fatalf("listed %d", n)
			}
			lat = append(lat, time.Since(t0))
		}
		reportPercentiles(b, lat)
		b.ReportMetric(rssMiB(b), "rss-MiB")
	})
}

// installKubeAPI installs the aggregated API's objects for a replica in
// this process and returns serve's flags for it.
func installKubeAPI(b *testing.B, env *kubetest.Env) []string {
	b.Helper()
	_, port, _ := strings.Cut(hosttest.FreeAddr(b), ":")
	n, _ := strconv.Atoi(port)
	args, err := deploy.InstallLocal(b.Context(), deployClient(b, env), b.TempDir(), n)
	if err != nil {
		b.Fatal(err)
	}
	return args
}

// deployClient reaches env as its admin with deploy's scheme.
func deployClient(b *testing.B, env *kubetest.Env) client.Client {
	b.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: deploy.NewScheme()})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// rssMiB is this process's resident set, from /proc.
func rssMiB(b *testing.B) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
