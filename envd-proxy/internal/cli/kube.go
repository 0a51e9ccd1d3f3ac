package cli

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
)

// openKubeFleet opens kube mode's fleet: an informer cache of NodeInventory
// objects, read through kubeinventory's freshness filter
// (fleetsource.OpenKube).
//
// The cache keeps of each inventory only what routing reads (the name,
// publishedAt, the endpoint and the sandbox IDs), and hands out its own
// objects instead of deep copies: the routing index lists the whole fleet
// on every NodeInventory and NodeInventoryShard event, and only reads what it gets. Nothing else
// may read through this cache.
func openKubeFleet(ctx context.Context, cfg *rest.Config, stale kubeinventory.Options) (*fleetsource.KubeFleet, error) {
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register the skiff.dev types: %w", err)
	}
	return fleetsource.OpenKube(ctx, cfg, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&v1beta1.NodeInventory{}:      {Transform: slimInventory, UnsafeDisableDeepCopy: ptr.To(true)},
			&v1beta1.NodeInventoryShard{}: {Transform: slimShard, UnsafeDisableDeepCopy: ptr.To(true)},
		},
	}, stale)
}

// slimInventory drops, before an inventory enters the cache, everything the
// routing index and the freshness filter do not read: managed fields,
// annotations, templates, pools, and all of each sandbox entry but its ID.
// At 2,000 sandboxes per node this is most of the object. Its changed
// sandboxes (spec.sandboxChanges) are decoded and kept as a list of IDs,
// as a shard's.
func slimInventory(obj any) (any, error) {
	inv, ok := obj.(*v1beta1.NodeInventory)
	if !ok {
		return obj, nil
	}
	inv.ManagedFields = nil
	inv.Annotations = nil
	inv.Spec.Templates = nil
	inv.Spec.Pools = nil
	idsOnly(inv.Spec.Sandboxes)
	if c := inv.Spec.SandboxChanges; c != nil {
		// Decoded here, once per version of the inventory, as a shard's.
		entries, err := c.Entries()
		if err != nil {
			slog.Warn("a NodeInventory's changed sandboxes are not all readable; the others are routed", "node", inv.Name, "resourceVersion", inv.ResourceVersion, "error", err)
		}
		c.Sandboxes, c.Packed = entries, ""
		idsOnly(c.Sandboxes)
	}
	return inv, nil
}

// slimShard is slimInventory for the shards that hold a host's
// sandboxes: only the IDs, and what the join reads (name, node, index,
// resourceVersion). Packed entries are decoded here, once per version of
// the shard, and kept as a list of IDs (those the join would keep).
func slimShard(obj any) (any, error) {
	sh, ok := obj.(*v1beta1.NodeInventoryShard)
	if !ok {
		return obj, nil
	}
	sh.ManagedFields = nil
	sh.Annotations = nil
	sh.OwnerReferences = nil
	entries, err := sh.Spec.Entries()
	if err != nil {
		slog.Warn("a NodeInventoryShard's packed sandboxes are not all readable; the others are routed", "shard", sh.Name, "resourceVersion", sh.ResourceVersion, "error", err)
	}
	sh.Spec.Sandboxes, sh.Spec.Packed = entries, ""
	idsOnly(sh.Spec.Sandboxes)
	return sh, nil
}

// idsOnly clears every field of each entry but its ID.
func idsOnly(entries []v1beta1.SandboxEntry) {
	for i := range entries {
		entries[i] = v1beta1.SandboxEntry{ID: entries[i].ID}
	}
}
