package fleet

import (
	"context"
	"fmt"
	"maps"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// List returns team's sandboxes in states from the fresh inventories,
// overridden by this replica's own recent writes (creates and claims the
// inventory does not list yet, state changes, kills). An inventory's
// entries for other nodes' sandboxes are not listed (inventory.Owned).
func (b *Backend) List(ctx context.Context, team string, states []e2bapi.State) ([]e2bapi.Sandbox, error) {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: list nodes: %w", err)
	}
	// The source's objects are shared with it (read, never written):
	// fromEntry copies what a listed sandbox keeps. The handlers order
	// and paginate.
	var all []e2bapi.Sandbox
	fresh := make(map[string]bool, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		fresh[n.Name] = true
		owned := inventory.Owned(n)
		for j := range owned {
			if e := &owned[j]; e.Team == team && e.State != v1beta1.SandboxWarm {
				all = append(all, fromEntry(n, e))
			}
		}
	}
	all = b.overlayRecent(team, all, fresh)
	out := all[:0]
	for _, sb := range all {
		if sb.ID != "" && wantState(states, sb.State) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// overlayRecent applies this replica's recent writes on team's sandboxes
// (on fresh nodes) to listed, the inventories' view: a create or claim the
// inventory does not show yet is added, a state change replaces the entry,
// a kill blanks its ID. A write the inventory shows, or that is older than
// the TTL, is forgotten.
func (b *Backend) overlayRecent(team string, listed []e2bapi.Sandbox, fresh map[string]bool) []e2bapi.Sandbox {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.recent) == 0 {
		return listed
	}
	index := make(map[string]int, len(listed))
	for i := range listed {
		index[listed[i].ID] = i
	}
	for id, w := range b.recent {
		at, inInventory := index[id]
		switch {
		case now.Sub(w.at) >= b.ttl,
			w.sb == nil && !inInventory && w.team == team,
			w.sb != nil && inInventory && listed[at].State == w.sb.State && w.team == team:
			// Expired, or the inventory shows the write: forget it.
			delete(b.recent, id)
			continue
		}
		if w.team != team || !fresh[w.node] {
			continue
		}
		switch {
		case w.sb == nil:
			listed[at].ID = "" // inInventory: a kill the inventory still lists
		case inInventory:
			listed[at] = *w.sb
			listed[at].Metadata = maps.Clone(w.sb.Metadata) // the caller's, not b.recent's
		default:
			sb := *w.sb
			sb.Metadata = maps.Clone(sb.Metadata)
			listed = append(listed, sb)
		}
	}
	return listed
}

// fromEntry converts an entry of n's inventory: its envd version, when
// the entry names none, is the node's.
func fromEntry(n *v1beta1.NodeInventory, e *v1beta1.SandboxEntry) e2bapi.Sandbox {
	sb := e2bapi.Sandbox{
		ID:          e.ID,
		TemplateID:  e.Template,
		Node:        n.Name,
		State:       e2bapi.StateRunning,
		EnvdVersion: e.EnvdVersion,
		StartedAt:   microseconds(e.StartedAt.Time),
		CPUMilli:    e.CPUMilli,
		MemoryMB:    e.MemoryMiB,
		DiskMB:      e.DiskMiB,
		Metadata:    maps.Clone(e.Metadata), // e is the source's (ListNodesShared)
	}
	if sb.EnvdVersion == "" {
		sb.EnvdVersion = n.Spec.EnvdVersion // the node's, which the entry leaves out
	}
	if e.State == v1beta1.SandboxPaused {
		sb.State = e2bapi.StatePaused
	}
	if e.EndAt != nil {
		sb.EndAt = microseconds(e.EndAt.Time)
	}
	if sb.State == e2bapi.StatePaused && e.PausedAt != nil {
		// e2b's end of a paused sandbox is when it paused.
		sb.EndAt = microseconds(e.PausedAt.Time)
	}
	return sb
}
