package kubeinventory

import (
	"fmt"
	"strconv"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// BenchmarkJoinChanges measures what a reader spends on one new version of
// a host's inventory under churn: 2,000 sandboxes in 16 packed shards that
// stay as they are, and an inventory that carries 128 changes (100
// entries changed, 28 new) — the decode of its changes and the join of
// the host's sandboxes with them, as the first list after each publish
// does.
func BenchmarkJoinChanges(b *testing.B) {
	const n, perHost, changed, added = 16, 2000, 100, 28
	entry := func(i int, meta string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: fmt.Sprintf("%020d", i), Template: "base", State: v1beta1.SandboxRunning, Team: "team-a",
			StartedAt: v1beta1.NewMicroTime(now), CPUMilli: 1000, MemoryMiB: 512, Metadata: map[string]string{"k": meta}}
	}
	parts := make([][]v1beta1.SandboxEntry, n)
	for i := range perHost {
		e := entry(i, "old")
		k := v1beta1.ShardOf(e.ID, n)
		parts[k] = append(parts[k], e)
	}
	shards := map[string]*v1beta1.NodeInventoryShard{}
	for k := range n {
		packed, err := v1beta1.PackSandboxes(parts[k])
		if err != nil {
			b.Fatal(err)
		}
		name := v1beta1.ShardName("h", k)
		shards[name] = &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: strconv.Itoa(k + 1)},
			Spec: v1beta1.NodeInventoryShardSpec{Node: "h", Index: int32(k), Packed: packed}}
	}
	// Versions of the changes: each carries 128 (100 entries changed, 28
	// new), and in "rolling" 40 of them are new since the version before
	// (a host's 2 s of churn), as a host's changes grow between folds; in
	// "all-new" none carry over.
	versions := func(carried int) []string {
		var out []string
		for v := range 8 {
			var changes []v1beta1.SandboxEntry
			first := v * (changed + added - carried)
			for i := first; i < first+changed+added; i++ {
				at := (i * 7) % perHost // spread over the shards
				if i%(changed+added) >= changed {
					at = perHost + i
				}
				changes = append(changes, entry(at, fmt.Sprint("v", i)))
			}
			packed, err := v1beta1.PackSandboxes(changes)
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, packed)
		}
		return out
	}
	lookup := func(name string) (*v1beta1.NodeInventoryShard, error) { return shards[name], nil }
	for _, bc := range []struct {
		name     string
		versions []string
	}{{"all-new", versions(0)}, {"rolling", versions(changed + added - 40)}} {
		b.Run(bc.name, func(b *testing.B) {
			src := New(nil, NewOptions())
			b.ReportAllocs()
			version := 1000
			for b.Loop() {
				version++
				one := v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "h", ResourceVersion: strconv.Itoa(version)},
					Spec: v1beta1.NodeInventorySpec{SandboxShards: n, SandboxChanges: &v1beta1.SandboxChanges{Packed: bc.versions[version%len(bc.versions)]}}}
				if err := src.join(&one, lookup, false); err != nil {
					b.Fatal(err)
				}
				if len(one.Spec.Sandboxes) < perHost {
					b.Fatalf("joined %d sandboxes, want at least %d", len(one.Spec.Sandboxes), perHost)
				}
			}
		})
	}
}
