package cli

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
)

// kubeFleet is the fleet of kube mode: an informer cache of NodeInventory
// objects read through kubeinventory's freshness filter.
//
// The cache keeps of each inventory only what routing reads (the name,
// publishedAt, the endpoint and the sandbox IDs), and hands out its own
// objects instead of deep copies: the routing index lists the whole fleet
// on every NodeInventory event, and only reads what it gets. Nothing else
// may read through this cache.
type kubeFleet struct {
	cache  cache.Cache
	source *kubeinventory.Source
}

func newKubeFleet(cfg *rest.Config, opts kubeinventory.Options) (*kubeFleet, error) {
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register the skiff.dev types: %w", err)
	}
	c, err := cache.New(cfg, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&v1beta1.NodeInventory{}: {Transform: slimInventory, UnsafeDisableDeepCopy: ptr.To(true)},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("create the NodeInventory cache: %w", err)
	}
	return &kubeFleet{cache: c, source: kubeinventory.New(c, opts)}, nil
}

// start runs the cache until ctx ends (wait returns, with the cache's
// error, when it has stopped), calls onChange on every NodeInventory event,
// and returns once the cache has synced.
func (k *kubeFleet) start(ctx context.Context, onChange func()) (wait func() error, err error) {
	inf, err := k.cache.GetInformer(ctx, &v1beta1.NodeInventory{})
	if err != nil {
		return nil, fmt.Errorf("get the NodeInventory informer: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { onChange() },
		UpdateFunc: func(any, any) { onChange() },
		DeleteFunc: func(any) { onChange() },
	}); err != nil {
		return nil, fmt.Errorf("watch NodeInventory events: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- k.cache.Start(ctx) }()
	wait = func() error { return <-done }
	if !k.cache.WaitForCacheSync(ctx) {
		if err := wait(); err != nil {
			return nil, fmt.Errorf("run the NodeInventory cache: %w", err)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sync the NodeInventory cache: %w", ctx.Err())
		}
		return nil, errors.New("sync the NodeInventory cache: the cache stopped")
	}
	return wait, nil
}

// slimInventory drops, before an inventory enters the cache, everything the
// routing index and the freshness filter do not read: managed fields,
// annotations, templates, pools, and all of each sandbox entry but its ID.
// At 2,000 sandboxes per node this is most of the object.
func slimInventory(obj any) (any, error) {
	inv, ok := obj.(*v1beta1.NodeInventory)
	if !ok {
		return obj, nil
	}
	inv.ManagedFields = nil
	inv.Annotations = nil
	inv.Spec.Templates = nil
	inv.Spec.Pools = nil
	for i := range inv.Spec.Sandboxes {
		inv.Spec.Sandboxes[i] = v1beta1.SandboxEntry{ID: inv.Spec.Sandboxes[i].ID}
	}
	return inv, nil
}
