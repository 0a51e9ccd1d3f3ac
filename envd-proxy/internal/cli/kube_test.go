package cli

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// The routing cache keeps a shard's sandbox IDs whichever field holds
// them: listed ones as they are, packed ones decoded (those the join
// would keep), and nothing else of either.
func TestSlimShardKeepsTheIDs(t *testing.T) {
	entry := func(id string, team string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxRunning, Team: team,
			StartedAt: metav1.Now(), Metadata: map[string]string{"k": "v"}}
	}
	packed, err := v1beta1.PackSandboxes([]v1beta1.SandboxEntry{
		entry("bbbbbbbbbbbbbbbbbbbb", "team-a"),
		entry("cccccccccccccccccccc", ""), // running without a team: not joined, not routed
	})
	if err != nil {
		t.Fatal(err)
	}
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
