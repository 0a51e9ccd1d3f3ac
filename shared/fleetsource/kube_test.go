package fleetsource_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1beta1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// openKube opens and starts the fleet of env, calling before (if not nil)
// before the start; the test's end stops it.
func openKube(ctx context.Context, t *testing.T, env *kubetest.Env, before func(*fleetsource.KubeFleet) error) *fleetsource.KubeFleet {
	t.Helper()
	kf, err := fleetsource.OpenKube(ctx, env.Config, cache.Options{Scheme: scheme(t)}, kubeinventory.NewOptions())
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		if err := before(kf); err != nil {
			t.Fatal(err)
		}
	}
	if err := kf.Start(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kf.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return kf
}

// On a real kube-apiserver: Start returns once the cache has synced, the
// fleet is the fresh NodeInventories, and every NodeInventory event reaches
// OnInventoryChange.
func TestOpenKubeFollowsTheInventories(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var changes atomic.Int32
	kf := openKube(ctx, t, env, func(kf *fleetsource.KubeFleet) error {
		return kf.OnInventoryChange(ctx, func() { changes.Add(1) })
	})
	inv := &v1beta1.NodeInventory{
		ObjectMeta:  metav1.ObjectMeta{Name: "host-a"},
		PublishedAt: &metav1.Time{Time: time.Now()},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: "127.0.0.1:27777",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 4},
		},
	}
	if err := env.Client.Create(ctx, inv); err != nil {
		t.Fatal(err)
	}
	for {
		nodes, err := kf.Source.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) == 1 && nodes[0].Name == "host-a" && changes.Load() > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("host-a never reached the fleet: nodes %d, %d events", len(nodes), changes.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if kf.Host() != env.Config.Host {
		t.Errorf("Host() = %q, want %q", kf.Host(), env.Config.Host)
	}
}

// After an outage of the kube-apiserver long enough for client-go's
// reflector to back off to half a minute, the cache watches again within
// RetryMax of the kube-apiserver's return, not within the backoff: a change
// made then reaches the fleet within a few seconds. (With client-go's own
// backoff, which this outage grows to 25-50 s, it does not, mostly.)
func TestOpenKubeWatchesAgainSoonAfterAnOutage(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	kf := openKube(ctx, t, env, nil)
	inv := &v1beta1.NodeInventory{
		ObjectMeta:  metav1.ObjectMeta{Name: "host-a"},
		PublishedAt: &metav1.Time{Time: time.Now()},
		Spec:        v1beta1.NodeInventorySpec{Endpoint: "127.0.0.1:27777"},
	}
	if err := env.Client.Create(ctx, inv); err != nil {
		t.Fatal(err)
	}
	endpoint := func() string {
		var got v1beta1.NodeInventory
		if err := kf.Cache.Get(ctx, client.ObjectKey{Name: "host-a"}, &got); err != nil {
			return err.Error()
		}
		return got.Spec.Endpoint
	}
	for endpoint() != inv.Spec.Endpoint {
		if ctx.Err() != nil {
			t.Fatalf("host-a never reached the cache: %s", endpoint())
		}
		time.Sleep(20 * time.Millisecond)
	}

	const outage = 40 * time.Second
	env.StopAPIServer(t)
	time.Sleep(outage)
	env.StartAPIServer(t)
	back := time.Now()
	inv.Spec.Endpoint = "127.0.0.1:27778"
	for {
		err := env.Client.Update(ctx, inv)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("update host-a after the outage: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	bound := fleetsource.RetryMax + 5*time.Second
	for endpoint() != inv.Spec.Endpoint {
		if time.Since(back) > bound {
			t.Fatalf("%s after the kube-apiserver came back from %s down, the cache still has endpoint %s (want %s): it does not watch again",
				bound, outage, endpoint(), inv.Spec.Endpoint)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the cache saw a change %s after the kube-apiserver came back from %s down", time.Since(back).Round(100*time.Millisecond), outage)
}

// A reader caps the fleet's reference by the kube-apiserver's time
// (--inventory-server-time), so that a reader whose clock runs behind the
// kube-apiserver's drops a dead host when the others do; capped by its own
// clock, it would keep the host as long as its clock is behind. The
// kube-apiserver's answers are dated five minutes ahead of this machine's
// clock, as a reader five minutes behind would see them.
func TestOpenKubeJudgesFreshnessInTheServersTime(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const ahead = 5 * time.Minute
	server := time.Now().Add(ahead)
	for name, stamp := range map[string]time.Time{"host-live": server, "host-dead": server.Add(-kubeinventory.DefaultStaleAfter - 10*time.Second)} {
		inv := &v1beta1.NodeInventory{
			ObjectMeta:  metav1.ObjectMeta{Name: name},
			PublishedAt: &metav1.Time{Time: stamp},
			Spec: v1beta1.NodeInventorySpec{
				Endpoint: "127.0.0.1:27777",
				Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 4},
			},
		}
		if err := env.Client.Create(ctx, inv); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return dateShift{rt, ahead} })
	for _, serverTime := range []bool{true, false} {
		opts := kubeinventory.NewOptions()
		opts.ServerTime = serverTime
		kf, err := fleetsource.OpenKube(ctx, cfg, cache.Options{Scheme: scheme(t)}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := kf.Start(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		nodes, err := kf.Source.ListNodes(ctx)
		if err := errors.Join(err, kf.Stop()); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, n := range nodes {
			names = append(names, n.Name)
		}
		slices.Sort(names)
		want := []string{"host-live"}
		if !serverTime {
			// The control: capped by the reader's clock, five minutes
			// behind, the dead host's stamp is not behind at all.
			want = []string{"host-dead", "host-live"}
		}
		if !slices.Equal(names, want) {
			t.Errorf("server time %v: the fleet is %v, want %v", serverTime, names, want)
		}
	}
}

// dateShift moves the Date of every answer by d.
type dateShift struct {
	rt http.RoundTripper
	d  time.Duration
}

func (s dateShift) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	if err == nil {
		if d, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
			resp.Header.Set("Date", d.Add(s.d).UTC().Format(http.TimeFormat))
		}
	}
	return resp, err
}
