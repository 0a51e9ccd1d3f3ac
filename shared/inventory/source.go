// Package inventory is how every Skiff reader (the apiserver, the envd proxy)
// sees the fleet of sandbox hosts: as a Source of NodeInventory objects.
//
// In production the Source is kubeinventory's, which reads the inventories
// that each host publishes to Kubernetes and drops the ones whose host has
// stopped publishing. StaticSource serves a fixed fleet, for running without
// Kubernetes and for tests of the readers.
package inventory

import (
	"context"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Source is the fleet as readers see it. Every method answers from fresh
// inventories only; a stale or absent node is an error for which
// apierrors.IsNotFound is true.
//
// The objects a Source returns belong to the caller.
type Source interface {
	// ListNodes returns every fresh inventory.
	ListNodes(ctx context.Context) ([]v1beta1.NodeInventory, error)
	// ListNodesShared returns every fresh inventory like ListNodes, but
	// what it returns may be shared with the Source (an informer cache's
	// own objects, copied shallowly): the caller only reads it, and copies
	// what it keeps. For the readers that look at the whole fleet on every
	// change, where deep copies of every sandbox are most of the work.
	ListNodesShared(ctx context.Context) ([]v1beta1.NodeInventory, error)
	// NodeInventory returns one fresh inventory by node name.
	NodeInventory(ctx context.Context, name string) (*v1beta1.NodeInventory, error)
	// NodeCapacity returns what one fresh node can hold in all.
	NodeCapacity(ctx context.Context, name string) (v1beta1.NodeCapacity, error)
	// WarmCandidates returns up to limit warm sandboxes of a template on
	// fresh nodes, spread across nodes.
	WarmCandidates(ctx context.Context, template string, limit int) ([]Candidate, error)
}

// Candidate is a warm sandbox that a create may claim.
type Candidate struct {
	// Node is the name of the node (and of its NodeInventory).
	Node string
	// Endpoint is the node's sandboxd host:port.
	Endpoint string
	// SandboxID is the warm sandbox's ID.
	SandboxID string
	// Pool is the warm pool (namespace/name) that started the sandbox.
	Pool string
}
