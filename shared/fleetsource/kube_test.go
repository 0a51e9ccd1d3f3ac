package fleetsource_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

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

// On a real kube-apiserver: Start returns once the cache has synced, the
// fleet is the fresh NodeInventories, and every NodeInventory event reaches
// OnInventoryChange.
func TestOpenKubeFollowsTheInventories(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kf, err := fleetsource.OpenKube(ctx, env.Config, cache.Options{Scheme: scheme(t)}, kubeinventory.NewOptions())
	if err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int32
	if err := kf.OnInventoryChange(ctx, func() { changes.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := kf.Start(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := kf.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
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
