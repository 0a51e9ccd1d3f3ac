package inventory_test

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func idOf(t testing.TB, node string) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(node))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestOwned(t *testing.T) {
	a1, a2, a3 := idOf(t, "host-a"), idOf(t, "host-a"), idOf(t, "host-a")
	b1 := idOf(t, "host-b")
	short := a1[:sandboxid.Len-sandboxid.TagLen-1] + string(sandboxid.NodeTag("host-a")) // right tag, too short
	tests := []struct {
		name string
		ids  []string
		want []string
	}{
		{"none", nil, nil},
		{"all owned", []string{a1, a2, a3}, []string{a1, a2, a3}},
		{"another node's first", []string{b1, a1, a2}, []string{a1, a2}},
		{"another node's between", []string{a1, b1, a2}, []string{a1, a2}},
		{"another node's last", []string{a1, a2, b1}, []string{a1, a2}},
		{"only another node's", []string{b1}, []string{}},
		{"not an ID's length", []string{a1, short, a1 + "x", "", "x"}, []string{a1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "host-a"}}
			for _, id := range tc.ids {
				inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: id, Team: "team-" + id})
			}
			before := inv.DeepCopy()
			got := inventory.Owned(inv)
			gotIDs := make([]string, 0, len(got))
			for _, e := range got {
				if e.Team != "team-"+e.ID {
					t.Errorf("entry %s came back as %+v", e.ID, e)
				}
				gotIDs = append(gotIDs, e.ID)
			}
			if !slices.Equal(gotIDs, tc.want) {
				t.Errorf("Owned = %q, want %q", gotIDs, tc.want)
			}
			if len(tc.want) == len(tc.ids) && len(got) > 0 && &got[0] != &inv.Spec.Sandboxes[0] {
				t.Error("Owned copied an inventory whose entries are all owned")
			}
			if len(got) > 0 {
				got[0].ID = "written"
			}
			if len(tc.want) < len(tc.ids) && !slices.EqualFunc(inv.Spec.Sandboxes, before.Spec.Sandboxes, func(a, b v1beta1.SandboxEntry) bool { return a.ID == b.ID }) {
				t.Errorf("Owned wrote to the inventory: %+v", inv.Spec.Sandboxes)
			}
		})
	}
}

// The node's tag is the one allocation (sandboxid.NodeTag's string).
func TestOwnedCopiesNothingWhenAllAreOwned(t *testing.T) {
	inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "host-a"}}
	for range 100 {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: idOf(t, "host-a")})
	}
	if n := testing.AllocsPerRun(100, func() { _ = inventory.Owned(inv) }); n > 1 {
		t.Errorf("Owned allocates %v times per call", n)
	}
}

func TestOwns(t *testing.T) {
	a, b := idOf(t, "host-a"), idOf(t, "host-b")
	for _, tc := range []struct {
		node, id string
		want     bool
	}{
		{"host-a", a, true},
		{"host-b", b, true},
		{"host-a", b, false},
		{"host-b", a, false},
		{"host-a", "", false},
		{"host-a", a[:sandboxid.Len-1], false},
		{"host-a", a + "x", false},
		{"", a, false},
	} {
		if got := inventory.Owns(tc.node, tc.id); got != tc.want {
			t.Errorf("Owns(%q, %q) = %v, want %v", tc.node, tc.id, got, tc.want)
		}
	}
}

// BenchmarkOwned is what the readers add per inventory they read anew: a
// node of 2,000 sandboxes, all its own.
func BenchmarkOwned(b *testing.B) {
	inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "host-a"}}
	for range 2000 {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: idOf(b, "host-a")})
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(inventory.Owned(inv)) != 2000 {
			b.Fatal("dropped an entry")
		}
	}
}
