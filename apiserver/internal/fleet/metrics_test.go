package fleet_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skiff-dev/skiff/apiserver/internal/metrics"
)

// Creates are counted where they are decided: a claim lost to another
// claimer, a warm claim, a cold create, and failures by reason.
func TestCreateMetrics(t *testing.T) {
	m := metrics.New()
	a, b := newFakeNode("node-a", "base"), newFakeNode("node-b", "base")
	idA, idB := a.addWarm(t, "base"), b.addWarm(t, "base")
	a.claimed[idA], b.claimed[idB] = true, true // both taken by someone else
	h := newHarnessWithMetrics(t, m, a, b)

	// Both warm candidates are lost: two conflicts, then a cold create.
	if _, err := h.b.Create(t.Context(), "team1", params("base")); err != nil {
		t.Fatal(err)
	}
	// idA leaves node-a's inventory, and idB is free to take: the only
	// candidate is claimed.
	a.mu.Lock()
	delete(a.sandboxes, idA)
	a.mu.Unlock()
	h.publish(a)
	b.claimed[idB] = false
	if sb, err := h.b.Create(t.Context(), "team1", params("base")); err != nil || sb.ID != idB {
		t.Fatalf("Create = %+v, %v; want the warm %s", sb, err, idB)
	}
	// No node holds py: capacity. Nine metadata entries: invalid (from the
	// host). A node that is down while the other is full: capacity.
	if _, err := h.b.Create(t.Context(), "team1", params("py")); err == nil {
		t.Fatal("Create of a template no node holds succeeded")
	}
	p := params("base")
	p.AllowInternetAccess = new(bool) // cold: no warm candidate is tried
	p.Metadata = map[string]string{"1": "", "2": "", "3": "", "4": "", "5": "", "6": "", "7": "", "8": "", "9": ""}
	if _, err := h.b.Create(t.Context(), "team1", p); err == nil {
		t.Fatal("Create with 9 metadata entries succeeded")
	}

	want := `
# HELP skiff_apiserver_creates_total Sandbox creates by outcome (warm, cold, failed) and, for a failure, reason (capacity, invalid, rate_limited, other).
# TYPE skiff_apiserver_creates_total counter
skiff_apiserver_creates_total{outcome="cold",reason=""} 1
skiff_apiserver_creates_total{outcome="failed",reason="capacity"} 1
skiff_apiserver_creates_total{outcome="failed",reason="invalid"} 1
skiff_apiserver_creates_total{outcome="failed",reason="other"} 0
skiff_apiserver_creates_total{outcome="failed",reason="rate_limited"} 0
skiff_apiserver_creates_total{outcome="warm",reason=""} 1
# HELP skiff_apiserver_warm_claim_conflicts_total Warm sandboxes a create tried to claim that another claimer had taken first (the host answered that the sandbox was no longer warm or gone).
# TYPE skiff_apiserver_warm_claim_conflicts_total counter
skiff_apiserver_warm_claim_conflicts_total 2
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"skiff_apiserver_creates_total", "skiff_apiserver_warm_claim_conflicts_total"); err != nil {
		t.Error(err)
	}
}

// A Backend without metrics counts nothing and does not fail.
func TestCreateWithoutMetrics(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "base"))
	if _, err := h.b.Create(t.Context(), "team1", params("base")); err != nil {
		t.Fatal(err)
	}
}
