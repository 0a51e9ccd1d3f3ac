package cli

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// BenchmarkStaleNodeLeavesRouting measures, against a real kube-apiserver
// and the proxy's own informer cache and index, how long a node that just
// went stale can still be routed: from the start of the write that makes it
// stale to the index no longer routing its sandbox. (With the publisher's
// stamps the write that does it is another node's publish; here node-b's
// own write sets its stamp past the window, which is the same event to the
// reader.) The refresh interval is set far out, so what is measured is the
// informer event path alone.
func BenchmarkStaleNodeLeavesRouting(b *testing.B) {
	env := kubetest.Start(b)
	ctx := b.Context()
	opts := kubeinventory.NewOptions()
	opts.StaleAfter = 3 * time.Second
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	kf, err := openKubeFleet(runCtx, env.Config, opts)
	if err != nil {
		b.Fatal(err)
	}
	index := fleet.New(kf.Source, fleet.Options{RefreshInterval: time.Hour})
	if err := kf.OnInventoryChange(runCtx, index.Poke); err != nil {
		b.Fatal(err)
	}
	if err := kf.Start(runCtx, 0); err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { _ = index.Run(runCtx); _ = kf.Stop() })

	idB, err := sandboxid.New(sandboxid.NodeTag("node-b"))
	if err != nil {
		b.Fatal(err)
	}
	routed := func() bool { _, ok := index.Lookup(idB); return ok }
	var took []time.Duration
	for b.Loop() {
		now := time.Now()
		if err := publish(ctx, env.Client, "node-a", "127.0.0.1:1", now); err != nil {
			b.Fatal(err)
		}
		if err := publish(ctx, env.Client, "node-b", "127.0.0.1:2", now, idB); err != nil {
			b.Fatal(err)
		}
		for !routed() {
			time.Sleep(time.Millisecond)
		}
		start := time.Now()
		if err := publish(ctx, env.Client, "node-b", "127.0.0.1:2", start.Add(-opts.StaleAfter-2*time.Second), idB); err != nil {
			b.Fatal(err)
		}
		for routed() {
			time.Sleep(100 * time.Microsecond)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
}
