package cli

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// entry is a running sandbox of team (none: invalid) with metadata.
func entry(id string, team string) v1beta1.SandboxEntry {
	return v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxRunning, Team: team,
		StartedAt: v1beta1.NewMicroTime(time.Now()), Metadata: map[string]string{"k": "v"}}
}

// packedBC is sandbox bbbbbbbbbbbbbbbbbbbb packed, and
// cccccccccccccccccccc, which runs without a team: not joined, not routed.
func packedBC(t *testing.T) string {
	t.Helper()
	packed, err := v1beta1.PackSandboxes([]v1beta1.SandboxEntry{entry("bbbbbbbbbbbbbbbbbbbb", "team-a"), entry("cccccccccccccccccccc", "")})
	if err != nil {
		t.Fatal(err)
	}
	return packed
}

// The routing cache keeps a shard's sandbox IDs whichever field holds
// them: listed ones as they are, packed ones decoded (those the join
// would keep), and nothing else of either.
func TestSlimShardKeepsTheIDs(t *testing.T) {
	packed := packedBC(t)
	sh := &v1beta1.NodeInventoryShard{
		ObjectMeta: metav1.ObjectMeta{Name: "n-s0", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "vk-sandbox"}}},
		Spec: v1beta1.NodeInventoryShardSpec{Node: "n", Sandboxes: []v1beta1.SandboxEntry{entry("aaaaaaaaaaaaaaaaaaaa", "team-a")},
			Packed: packed},
	}
	out, err := slimShard(sh)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1beta1.NodeInventoryShard)
	want := []v1beta1.SandboxEntry{{ID: "aaaaaaaaaaaaaaaaaaaa"}, {ID: "bbbbbbbbbbbbbbbbbbbb"}}
	if !slices.EqualFunc(got.Spec.Sandboxes, want, func(a, b v1beta1.SandboxEntry) bool { return a.ID == b.ID && a.Template == "" && a.Metadata == nil }) ||
		got.Spec.Packed != "" || got.ManagedFields != nil {
		t.Fatalf("slimmed shard: %+v", got)
	}
}

// The routing cache keeps an inventory's changed sandboxes as IDs too,
// decoded from spec.sandboxChanges.packed (those the join would keep),
// and the IDs removed as they are.
func TestSlimInventoryKeepsTheChangedIDs(t *testing.T) {
	packed := packedBC(t)
	inv := &v1beta1.NodeInventory{
		ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "vk-sandbox"}}},
		Spec: v1beta1.NodeInventorySpec{SandboxShards: 4, SandboxChanges: &v1beta1.SandboxChanges{
			Fold: 7, Packed: packed, Removed: []string{"dddddddddddddddddddd"},
		}},
	}
	out, err := slimInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1beta1.NodeInventory).Spec.SandboxChanges
	if got == nil || len(got.Sandboxes) != 1 || got.Sandboxes[0].ID != "bbbbbbbbbbbbbbbbbbbb" || got.Sandboxes[0].Template != "" || got.Sandboxes[0].Metadata != nil ||
		got.Packed != "" || got.Fold != 7 || !slices.Equal(got.Removed, []string{"dddddddddddddddddddd"}) {
		t.Fatalf("slimmed changes: %+v", got)
	}
}
