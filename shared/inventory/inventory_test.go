package inventory_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// host returns an inventory whose sandboxes are given as template:state pairs,
// with IDs <name>-<index>.
func host(name string, sandboxes ...string) v1beta1.NodeInventory {
	inv := v1beta1.NodeInventory{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: name + ":27777",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 10},
		},
	}
	for i, s := range sandboxes {
		tmpl, state, _ := strings.Cut(s, ":")
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{
			ID: fmt.Sprintf("%s-%d", name, i), Template: tmpl, State: v1beta1.SandboxState(state), Pool: "team/" + tmpl,
		})
	}
	return inv
}

func ids(cands []inventory.Candidate) []string {
	out := make([]string, 0, len(cands))
	for _, c := range cands {
		out = append(out, c.SandboxID)
	}
	return out
}

func TestPickWarm(t *testing.T) {
	nodes := []v1beta1.NodeInventory{
		host("a", "base:warm", "base:running", "base:warm", "py:warm", "base:warm"),
		host("b", "py:warm", "base:paused"),
		host("c", "base:warm"),
		host("d"),
	}
	for _, tc := range []struct {
		name     string
		template string
		limit    int
		// want is the set of IDs; perNode bounds how many come from each
		// node after the first len(nodes with warm) picks.
		want []string
	}{
		{"zero limit", "base", 0, nil},
		{"negative limit", "base", -1, nil},
		{"unknown template", "go", 5, nil},
		{"one per node first", "base", 2, nil},
		{"every warm one", "base", 10, []string{"a-0", "a-2", "a-4", "c-0"}},
		{"exact count", "base", 4, []string{"a-0", "a-2", "a-4", "c-0"}},
		{"other template", "py", 10, []string{"a-3", "b-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 { // the start node is random: every start must hold
				got := inventory.PickWarm(nodes, tc.template, tc.limit)
				if tc.name == "one per node first" {
					if len(got) != 2 || got[0].Node == got[1].Node {
						t.Fatalf("PickWarm = %v, want one from each of a and c", ids(got))
					}
					continue
				}
				gotIDs := ids(got)
				slices.Sort(gotIDs)
				if !slices.Equal(gotIDs, tc.want) {
					t.Fatalf("PickWarm = %v, want %v", gotIDs, tc.want)
				}
			}
		})
	}
}

// Candidates come round-robin: no node gives its k+1-th sandbox before every
// node with k+1 warm sandboxes has given its k-th, and each candidate carries
// its node's endpoint and its pool.
func TestPickWarmSpreads(t *testing.T) {
	var nodes []v1beta1.NodeInventory
	for i := range 5 {
		var sbs []string
		for range i + 1 {
			sbs = append(sbs, "base:warm", "base:running")
		}
		nodes = append(nodes, host(fmt.Sprintf("n%d", i), sbs...))
	}
	starts := map[string]bool{}
	for range 200 {
		got := inventory.PickWarm(nodes, "base", 9)
		if len(got) != 9 {
			t.Fatalf("got %d candidates, want 9", len(got))
		}
		starts[got[0].Node] = true
		per := map[string]int{}
		for i, c := range got {
			per[c.Node]++
			if c.Endpoint != c.Node+":27777" || c.Pool != "team/base" {
				t.Fatalf("candidate %+v has the wrong endpoint or pool", c)
			}
			if i < 5 && per[c.Node] > 1 {
				t.Fatalf("candidate %d is %s's second before every node gave one: %v", i, c.Node, ids(got))
			}
		}
		// 9 = 5 firsts + 4 seconds (n1..n4 have a second).
		if per["n0"] != 1 || slices.Max(slices.Collect(maps.Values(per))) != 2 {
			t.Fatalf("per node = %v, want n0 once and no node more than twice", per)
		}
		seen := map[string]bool{}
		for _, id := range ids(got) {
			if seen[id] {
				t.Fatalf("sandbox %s picked twice: %v", id, ids(got))
			}
			seen[id] = true
		}
	}
	if len(starts) < 3 {
		t.Fatalf("first candidate came from only %v in 200 picks: the start is not spread", slices.Collect(maps.Keys(starts)))
	}
}

// TestPickWarmSpreadsWithinANode proves that concurrent creates on a fleet of
// one node do not all race for the same few warm sandboxes.
func TestPickWarmSpreadsWithinANode(t *testing.T) {
	sbs := make([]string, 10)
	for i := range sbs {
		sbs[i] = "base:warm"
	}
	nodes := []v1beta1.NodeInventory{host("a", sbs...)}
	firsts := map[string]bool{}
	for range 200 {
		got := inventory.PickWarm(nodes, "base", 3)
		if len(got) != 3 || got[0].SandboxID == got[1].SandboxID || got[1].SandboxID == got[2].SandboxID || got[0].SandboxID == got[2].SandboxID {
			t.Fatalf("PickWarm = %v, want 3 distinct", ids(got))
		}
		firsts[got[0].SandboxID] = true
	}
	if len(firsts) < 8 { // 10 equally likely firsts in 200 draws
		t.Fatalf("the first candidate was one of only %d sandboxes in 200 picks, want nearly all 10", len(firsts))
	}
}

func TestPickWarmAllocatesPerCandidate(t *testing.T) {
	var nodes []v1beta1.NodeInventory
	for i := range 200 {
		nodes = append(nodes, host(fmt.Sprintf("n%d", i), "base:running", "base:running", "base:warm"))
	}
	allocs := testing.AllocsPerRun(100, func() { inventory.PickWarm(nodes, "base", 8) })
	if allocs > 2 {
		t.Fatalf("PickWarm allocated %.0f times for 8 candidates of 200 nodes, want at most 2 (result and positions)", allocs)
	}
}

func TestStaticSource(t *testing.T) {
	ctx := t.Context()
	a, b := host("a", "base:warm"), host("b", "base:warm")
	s := inventory.NewStaticSource(&b, &a)

	list, err := s.ListNodes(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "a" || list[1].Name != "b" {
		t.Fatalf("ListNodes = %v, %v; want a and b in order", list, err)
	}
	// What a caller gets is its own; what Apply took is a copy.
	list[0].Spec.Sandboxes[0].ID = "changed"
	a.Spec.Endpoint = "changed:1"
	inv, err := s.NodeInventory(ctx, "a")
	if err != nil || inv.Spec.Sandboxes[0].ID != "a-0" || inv.Spec.Endpoint != "a:27777" {
		t.Fatalf("NodeInventory(a) = %+v, %v; want it unchanged", inv, err)
	}
	if c, err := s.NodeCapacity(ctx, "b"); err != nil || c.Sandboxes != 10 {
		t.Fatalf("NodeCapacity(b) = %+v, %v", c, err)
	}
	cands, err := s.WarmCandidates(ctx, "base", 5)
	if err != nil || len(cands) != 2 {
		t.Fatalf("WarmCandidates = %+v, %v; want 2", cands, err)
	}

	s.Remove("a")
	s.Remove("never-there")
	if _, err := s.NodeInventory(ctx, "a"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInventory(removed) = %v, want NotFound", err)
	}
	if _, err := s.NodeCapacity(ctx, "a"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeCapacity(removed) = %v, want NotFound", err)
	}
	b2 := host("b", "base:warm", "base:warm")
	s.Apply(&b2)
	if cands, _ := s.WarmCandidates(ctx, "base", 5); len(cands) != 2 || cands[0].Node != "b" {
		t.Fatalf("WarmCandidates after re-apply = %+v, want b's two", cands)
	}
}

func TestNotFound(t *testing.T) {
	err := inventory.NotFound("n1")
	if !apierrors.IsNotFound(err) {
		t.Fatalf("IsNotFound(%v) = false", err)
	}
	if got, want := err.Error(), `nodeinventories.skiff.dev "n1" not found`; got != want {
		t.Fatalf("err = %q, want %q", got, want)
	}
	if err := inventory.Stale("n1", 100e9, 90e9); !apierrors.IsNotFound(err) {
		t.Fatalf("IsNotFound(Stale) = false: %v", err)
	}
}
