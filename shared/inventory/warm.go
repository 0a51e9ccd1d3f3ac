package inventory

import (
	"math/rand/v2"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// PickWarm returns up to limit warm sandboxes of template from nodes, spread
// across nodes: one from each node that has one, then a second from each, and
// so on. It starts at a random node, so that concurrent creates (each claims
// the first candidate that is still warm) do not all race for one sandbox.
//
// PickWarm only reads nodes: the candidates' strings share memory with them,
// and it allocates in proportion to the candidates it returns, never to the
// fleet. Callers filter nodes for freshness first.
func PickWarm(nodes []v1beta1.NodeInventory, template string, limit int) []Candidate {
	n := len(nodes)
	if limit <= 0 || n == 0 {
		return nil
	}
	start := rand.IntN(n)
	// Within a node the scan starts at a random entry too (and wraps), so
	// concurrent creates on a fleet of one node spread as well.
	offset := rand.IntN(1 << 30)
	out := make([]Candidate, 0, min(limit, n))
	// found[k] says where out[k] came from. A round visits the nodes in the
	// same order as the one before, so the previous round's entries, read in
	// step, tell each node where to resume; a node that had none is done.
	type position struct{ visit, at int }
	found := make([]position, 0, cap(out))
	prev, prevEnd := 0, 0
	for round := 0; len(out) < limit; round++ {
		roundStart := len(found)
		for visit := 0; visit < n && len(out) < limit; visit++ {
			from := 0
			if round > 0 {
				if prev == prevEnd || found[prev].visit != visit {
					continue // no warm sandbox left on this node
				}
				from = found[prev].at + 1
				prev++
			}
			node := &nodes[(start+visit)%n]
			at := nextWarm(node.Spec.Sandboxes, from, offset, template)
			if at < 0 {
				continue
			}
			sb := &node.Spec.Sandboxes[(offset+at)%len(node.Spec.Sandboxes)]
			out = append(out, Candidate{Node: node.Name, Endpoint: node.Spec.Endpoint, SandboxID: sb.ID, Pool: sb.Pool})
			found = append(found, position{visit: visit, at: at})
		}
		if len(found) == roundStart {
			break // a round found nothing: every node is done
		}
		prev, prevEnd = roundStart, len(found)
	}
	return out
}

// nextWarm returns the first position at or after from that holds a warm
// sandbox of template, or -1. Position v is sandboxes[(offset+v) % len].
func nextWarm(sandboxes []v1beta1.SandboxEntry, from, offset int, template string) int {
	for v := from; v < len(sandboxes); v++ {
		if e := &sandboxes[(offset+v)%len(sandboxes)]; e.State == v1beta1.SandboxWarm && e.Template == template {
			return v
		}
	}
	return -1
}
