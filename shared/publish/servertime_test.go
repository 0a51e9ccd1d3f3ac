package publish

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/shared/serverclock"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// TestApplierStampsTheServersTime runs a publisher whose clock is minutes
// off against a real kube-apiserver: its stamps are in the
// kube-apiserver's time from its first publish on, and from its first
// write when it asks the kube-apiserver's time first (LearnServerTime).
func TestApplierStampsTheServersTime(t *testing.T) {
	env := kubetest.Start(t)
	watcher := dynamic.NewForConfigOrDie(env.Config)
	for _, tc := range []struct {
		skew  time.Duration
		learn bool // LearnServerTime set
	}{{-3 * time.Minute, false}, {5 * time.Minute, false}, {-3 * time.Minute, true}} {
		skew := tc.skew
		t.Run(fmt.Sprintf("%s learn=%v", skew, tc.learn), func(t *testing.T) {
			node := "host-skew-" + map[bool]string{true: "behind", false: "ahead"}[skew < 0] + map[bool]string{true: "-learns"}[tc.learn]
			now := func() time.Time { return time.Now().Add(skew) }
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			clock := serverclock.New(serverclock.Config{Now: now})
			m.ShowClock(clock)
			cfg := rest.CopyConfig(env.Config)
			cfg.Wrap(clock.Wrap)
			writes := watchWrites(t, watcher, node)
			src := newSource(node, 2)
			interval := 30 * time.Second
			c := Config{Source: src, Writer: NewKubeWriter(dynamic.NewForConfigOrDie(cfg), Options{}), Changes: src.changes, NodeName: node,
				Options: Options{Interval: interval, MinInterval: 100 * time.Millisecond}, Metrics: m, Now: now, ServerClock: clock}
			if tc.learn {
				// As vk-sandbox asks: GET /version, through the clock.
				c.LearnServerTime = func(ctx context.Context) error {
					return discovery.NewDiscoveryClientForConfigOrDie(cfg).RESTClient().Get().AbsPath("/version").Do(ctx).Error()
				}
			}
			run(t, New(c))

			// Without LearnServerTime, the first write goes out before
			// any answer has told the clock, stamped by the host's clock;
			// its answer does, and the same publish stamps again rather
			// than wait an interval. With it, the first write is stamped
			// in the kube-apiserver's time.
			// Every write from then on is in the kube-apiserver's time
			// (whole seconds; the kube-apiserver runs on this machine's
			// clock).
			inServerTime := func(w stamped) bool {
				// Whole seconds, the estimate's second, the writes and
				// the watch's delivery on a loaded machine, against a
				// host minutes off.
				d := time.Since(w.stamp)
				return d >= -2*time.Second && d <= 30*time.Second
			}
			first := next(t, writes, 30*time.Second)
			switch {
			case tc.learn && !inServerTime(first):
				// Asked before the first stamp, the kube-apiserver told
				// the clock its time.
				t.Fatalf("the first write is stamped %s, %s from the kube-apiserver's time, though its time was asked first (the host's clock is %s off)", first.stamp, -time.Since(first.stamp), skew)
			case !tc.learn && inServerTime(first):
				t.Fatalf("the first write is stamped %s, in the kube-apiserver's time before any answer (the host's clock is %s off)", first.stamp, skew)
			case !tc.learn:
				second := next(t, writes, interval/2)
				if !inServerTime(second) {
					t.Fatalf("the second write is stamped %s, %s from the kube-apiserver's time (the host's clock is %s off)", second.stamp, -time.Since(second.stamp), skew)
				}
			}
			src.set(node, 3)
			if w := next(t, writes, interval/2); !inServerTime(w) || len(w.spec.Sandboxes) != 3 {
				t.Fatalf("the change was written with %d sandboxes, stamped %s (the host's clock is %s off)", len(w.spec.Sandboxes), w.stamp, skew)
			}
			if got := gauge(t, reg, "skiff_vk_sandbox_clock_offset_seconds"); got < -skew.Seconds()-2 || got > -skew.Seconds()+2 {
				t.Errorf("skiff_vk_sandbox_clock_offset_seconds = %v, want about %v", got, -skew.Seconds())
			}
		})
	}
}

// gauge is the value of the unlabelled gauge name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
