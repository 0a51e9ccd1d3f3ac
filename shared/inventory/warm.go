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
			at := nextWarm(node.Spec.Sandboxes, from, template)
			if at < 0 {
				continue
			}
			sb := &node.Spec.Sandboxes[at]
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

// nextWarm returns the index of the first warm sandbox of template at or after
// from, or -1.
func nextWarm(sandboxes []v1beta1.SandboxEntry, from int, template string) int {
	for j := from; j < len(sandboxes); j++ {
		if sandboxes[j].State == v1beta1.SandboxWarm && sandboxes[j].Template == template {
			return j
		}
	}
	return -1
}
