package inventory

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// StaticSource is a Source over a fleet that its owner sets by hand, for
// running without Kubernetes (a single host, a fixed list of hosts) and for
// tests. It applies no freshness filter: a node stays until it is removed.
// It is safe for concurrent use.
type StaticSource struct {
	mu    sync.RWMutex
	nodes map[string]*v1beta1.NodeInventory
	// version is the last resourceVersion Apply gave.
	version uint64
}

var _ Source = (*StaticSource)(nil)

// NewStaticSource returns a StaticSource holding a copy of each inventory.
func NewStaticSource(invs ...*v1beta1.NodeInventory) *StaticSource {
	s := &StaticSource{nodes: make(map[string]*v1beta1.NodeInventory, len(invs))}
	for _, inv := range invs {
		s.Apply(inv)
	}
	return s
}

// Apply adds a copy of inv, or replaces the inventory of the same name.
// A copy without a resourceVersion gets a new one.
func (s *StaticSource) Apply(inv *v1beta1.NodeInventory) {
	c := inv.DeepCopy()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.ResourceVersion == "" {
		// As a kube-apiserver does, a new version on every write, so
		// that readers that skip an unchanged node by its version (the
		// proxy's index, the warm-pool driver) see every change.
		s.version++
		c.ResourceVersion = strconv.FormatUint(s.version, 10)
	}
	s.nodes[c.Name] = c
}

// Remove drops the inventory of a node; removing an absent node does nothing.
func (s *StaticSource) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, name)
}

// ListNodes returns a copy of every inventory, sorted by name.
func (s *StaticSource) ListNodes(context.Context) ([]v1beta1.NodeInventory, error) {
	s.mu.RLock()
	out := make([]v1beta1.NodeInventory, 0, len(s.nodes))
	for _, inv := range s.nodes {
		out = append(out, *inv.DeepCopy())
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b v1beta1.NodeInventory) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ListNodesShared returns shallow copies of every inventory, sorted by
// name: Apply replaces an inventory whole and never writes to one it
// holds, so they stay as they are for the caller to read.
func (s *StaticSource) ListNodesShared(context.Context) ([]v1beta1.NodeInventory, error) {
	s.mu.RLock()
	out := make([]v1beta1.NodeInventory, 0, len(s.nodes))
	for _, inv := range s.nodes {
		out = append(out, *inv)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b v1beta1.NodeInventory) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// NodeInventory returns a copy of one inventory.
func (s *StaticSource) NodeInventory(_ context.Context, name string) (*v1beta1.NodeInventory, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	inv, ok := s.nodes[name]
	if !ok {
		return nil, NotFound(name)
	}
	return inv.DeepCopy(), nil
}

// NodeCapacity returns what one node can hold in all.
func (s *StaticSource) NodeCapacity(_ context.Context, name string) (v1beta1.NodeCapacity, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	inv, ok := s.nodes[name]
	if !ok {
		return v1beta1.NodeCapacity{}, NotFound(name)
	}
	return inv.Spec.Capacity, nil
}

// WarmCandidates returns up to limit warm sandboxes of template, spread
// across nodes (see PickWarm).
func (s *StaticSource) WarmCandidates(_ context.Context, template string, limit int) ([]Candidate, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	nodes := make([]v1beta1.NodeInventory, 0, len(s.nodes))
	for _, inv := range s.nodes {
		nodes = append(nodes, *inv) // shallow: PickWarm only reads, and Apply never mutates a stored inventory
	}
	return PickWarm(nodes, template, limit), nil
}

// NotFound is the error every Source returns for an absent or stale node: a
// Kubernetes NotFound for nodeinventories.skiff.dev, so apierrors.IsNotFound
// is true for it and for any error that wraps it.
func NotFound(name string) error {
	return apierrors.NewNotFound(v1beta1.Resource(v1beta1.NodeInventoryResource), name)
}

// Stale returns the error for a node whose inventory trails the fleet: a
// NotFound (see NotFound) that says why.
func Stale(name string, behind, window time.Duration) error {
	return fmt.Errorf("node inventory %s is stale, %s behind the fleet (window %s): %w", name, behind, window, NotFound(name))
}
