package v1beta1

import (
	"slices"
	"testing"
	"time"
)

// A shard's entries are its listed ones, then its valid packed ones; the
// listed slice is never written to, even with room to spare.
func TestShardEntries(t *testing.T) {
	entry := func(id, team string) SandboxEntry {
		return SandboxEntry{ID: id, Template: "base", State: SandboxRunning, Team: team, StartedAt: NewMicroTime(time.Now())}
	}
	listed := make([]SandboxEntry, 1, 4) // room after it: an append must not use it
	listed[0] = entry("aaaaaaaaaaaaaaaaaaaa", "t")
	packed, err := PackSandboxes([]SandboxEntry{entry("bbbbbbbbbbbbbbbbbbbb", "t"), entry("cccccccccccccccccccc", "")})
	if err != nil {
		t.Fatal(err)
	}
	spec := NodeInventoryShardSpec{Node: "n", Sandboxes: listed, Packed: packed}
	got, err := spec.Entries()
	if err == nil {
		t.Error("Entries kept quiet about a packed entry without a team")
	}
	ids := func(es []SandboxEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.ID)
		}
		return out
	}
	if want := []string{"aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"}; !slices.Equal(ids(got), want) {
		t.Errorf("Entries = %v, want %v", ids(got), want)
	}
	if extra := listed[:2][1]; extra.ID != "" {
		t.Errorf("Entries wrote %s into spec.sandboxes' spare room", extra.ID)
	}
	spec.Packed = ""
	if got, err := spec.Entries(); err != nil || !slices.Equal(ids(got), []string{"aaaaaaaaaaaaaaaaaaaa"}) {
		t.Errorf("Entries of a listed shard = %v, %v", ids(got), err)
	}
}

// ShardNode reads back the node of every name ShardName makes, and no
// other name.
func TestShardNode(t *testing.T) {
	for _, node := range []string{"n", "host-s3", "a-s-b", "node-7"} {
		for _, k := range []int{0, 7, 15} {
			if got, ok := ShardNode(ShardName(node, k)); !ok || got != node {
				t.Errorf("ShardNode(ShardName(%q, %d)) = %q, %v", node, k, got, ok)
			}
		}
	}
	for _, name := range []string{"", "node", "-s1", "node-s", "node-s01", "node-s-1", "node-s+1", "node-sx"} {
		if got, ok := ShardNode(name); ok {
			t.Errorf("ShardNode(%q) = %q, true; want no node", name, got)
		}
	}
}
