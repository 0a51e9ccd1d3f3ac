package fleet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

// List returns team's sandboxes in states from the fresh inventories,
// overridden by this replica's own recent writes (creates and claims the
// inventory does not list yet, state changes, kills).
func (b *Backend) List(ctx context.Context, team string, states []e2bapi.State) ([]e2bapi.Sandbox, error) {
	nodes, err := b.src.ListNodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: list nodes: %w", err)
	}
	byID := make(map[string]e2bapi.Sandbox)
	listed := make(map[string]e2bapi.State) // every sandbox of team the inventories list, by ID
	fresh := make(map[string]bool, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		fresh[n.Name] = true
		for j := range n.Spec.Sandboxes {
			e := &n.Spec.Sandboxes[j]
			if e.Team != team || e.State == v1beta1.SandboxWarm {
				continue
			}
			sb := fromEntry(n.Name, e)
			listed[e.ID] = sb.State
			byID[e.ID] = sb
		}
	}

	now := b.now()
	b.mu.Lock()
	for id, w := range b.recent {
		st, inInventory := listed[id]
		switch {
		case now.Sub(w.at) >= b.ttl,
			w.sb == nil && !inInventory && w.team == team,
			w.sb != nil && inInventory && st == w.sb.State && w.team == team:
			// Expired, or the inventory shows the write: forget it.
			delete(b.recent, id)
			continue
		}
		if w.team != team || !fresh[w.node] {
			continue
		}
		if w.sb == nil {
			delete(byID, id)
		} else {
			byID[id] = *w.sb
		}
	}
	b.mu.Unlock()

	out := make([]e2bapi.Sandbox, 0, len(byID))
	for _, sb := range byID {
		if wantState(states, sb.State) {
			sb.Metadata = maps.Clone(sb.Metadata)
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b e2bapi.Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// fromEntry converts an inventory entry of node.
func fromEntry(node string, e *v1beta1.SandboxEntry) e2bapi.Sandbox {
	sb := e2bapi.Sandbox{
		ID:         e.ID,
		TemplateID: e.Template,
		Node:       node,
		State:      e2bapi.StateRunning,
		StartedAt:  e.StartedAt.Time,
		CPUMilli:   e.CPUMilli,
		MemoryMB:   e.MemoryMiB,
		Metadata:   e.Metadata,
	}
	if e.State == v1beta1.SandboxPaused {
		sb.State = e2bapi.StatePaused
	}
	if e.EndAt != nil {
		sb.EndAt = e.EndAt.Time
	}
	return sb
}
