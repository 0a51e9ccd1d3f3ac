package v1beta1

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeInventoryShardResource is the plural resource name of
// NodeInventoryShard.
const NodeInventoryShardResource = "nodeinventoryshards"

// MaxInventoryShards is the most shards one host's sandboxes are split into.
const MaxInventoryShards = 64

// NodeInventoryShard holds a part of one host's sandboxes: those whose IDs
// hash to its index (see NodeInventorySpec.SandboxShards). Its name is
// ShardName(spec.node, spec.index). Only that host's vk-sandbox writes it,
// and only when one of its own entries changed, so that the NodeInventory
// it belongs to, stamped every publish interval, stays a few hundred bytes
// and a change rewrites one shard rather than every sandbox of the host.
// It is owned by that NodeInventory: deleting the inventory deletes its
// shards.
//
// Readers never use a shard directly: the freshness filter in
// shared/inventory/kubeinventory joins the shards of each fresh inventory
// into its spec.sandboxes, and a stale inventory's shards leave with it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ninvs,categories=skiff
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Index",type=integer,JSONPath=`.spec.index`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeInventoryShard struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the shard's part of the host's inventory.
	// +required
	Spec NodeInventoryShardSpec `json:"spec"`
}

// NodeInventoryShardSpec is one shard of a host's sandboxes.
type NodeInventoryShardSpec struct {
	// Node is the name of the host (and of its NodeInventory).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=249
	Node string `json:"node"`

	// Index is the shard's place among the host's shards, from 0 to the
	// inventory's spec.sandboxShards - 1.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=63
	Index int32 `json:"index"`

	// Sandboxes are the host's sandboxes of this shard, as
	// NodeInventorySpec.Sandboxes (atomic: the host replaces it whole).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	Sandboxes []SandboxEntry `json:"sandboxes,omitempty"`

	// Packed holds more of the shard's sandboxes as one JSON array of
	// SandboxEntry, which the apiserver stores as a string: a rewrite of
	// 125 entries costs it a seventh of the same entries in Sandboxes,
	// whose every field it decodes and validates (BenchmarkShardWriteServerCost
	// in shared/publish). vk-sandbox writes this unless told to keep
	// Sandboxes for readers older than it (--publish-shard-format); readers
	// join both, and check each packed entry against what the schema checks
	// of Sandboxes (SandboxEntry.Validate), dropping one that fails.
	// +optional
	// +kubebuilder:validation:MaxLength=1048576
	Packed string `json:"packed,omitempty"`

	// Fold is the number of the host's fold that wrote this shard; each
	// fold's is greater than the last. The inventory's
	// spec.sandboxChanges apply to this shard while their fold is at
	// least this one: a shard written by a later fold holds those changes
	// already. 0: written by a host that keeps no changes in its
	// inventory.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Fold int64 `json:"fold,omitempty"`
}

// PackSandboxes encodes entries for NodeInventoryShardSpec.Packed; none is
// "".
func PackSandboxes(entries []SandboxEntry) (string, error) {
	if len(entries) == 0 {
		return "", nil
	}
	raw, err := json.Marshal(entries)
	if err != nil {
		return "", fmt.Errorf("pack %d sandbox entries: %w", len(entries), err)
	}
	return string(raw), nil
}

// UnpackedSandboxes returns the entries of s.Packed that pass
// SandboxEntry.Validate, and one error for what did not: packed that does
// not decode (then no entry), or the entries dropped.
func (s *NodeInventoryShardSpec) UnpackedSandboxes() ([]SandboxEntry, error) {
	entries, err := UnpackSandboxes(s.Packed)
	if err != nil {
		return entries, fmt.Errorf("shard %d of node %s: spec.packed: %w", s.Index, s.Node, err)
	}
	return entries, nil
}

// Entries returns the shard's sandboxes: spec.sandboxes, then the entries
// of spec.packed that pass SandboxEntry.Validate, with UnpackedSandboxes'
// error for those it dropped. It never writes to spec.sandboxes (with
// nothing packed, the result is spec.sandboxes itself).
func (s *NodeInventoryShardSpec) Entries() ([]SandboxEntry, error) {
	packed, err := s.UnpackedSandboxes()
	return listedThenPacked(s.Sandboxes, packed), err
}

// UnpackSandboxes decodes packed (PackSandboxes' encoding; "" is none)
// and returns its valid entries (ValidEntries), and one error for what it
// did not keep: packed that does not decode (then no entry), or the
// entries dropped.
func UnpackSandboxes(packed string) ([]SandboxEntry, error) {
	if packed == "" {
		return nil, nil
	}
	var entries []SandboxEntry
	if err := json.Unmarshal([]byte(packed), &entries); err != nil {
		return nil, err
	}
	return ValidEntries(entries)
}

// ValidEntries returns the entries that pass SandboxEntry.Validate, at
// most MaxShardEntries, compacted in entries' own array, and one error
// for what it dropped. Readers of packed entries, which the apiserver
// does not check, keep only these.
func ValidEntries(entries []SandboxEntry) ([]SandboxEntry, error) {
	var errs []error
	kept := entries[:0]
	for i := range entries {
		if err := entries[i].Validate(); err != nil {
			errs = append(errs, fmt.Errorf("entry %d: %w", i, err))
			continue
		}
		kept = append(kept, entries[i])
	}
	if len(kept) > MaxShardEntries {
		errs = append(errs, fmt.Errorf("%d entries, past the %d a host may have: the first %d kept", len(kept), MaxShardEntries, MaxShardEntries))
		kept = kept[:MaxShardEntries]
	}
	if len(errs) > 0 {
		return kept, fmt.Errorf("%d dropped: %w", len(entries)-len(kept), errors.Join(errs...))
	}
	return kept, nil
}

// listedThenPacked is listed followed by packed, never written into
// listed's spare room (with nothing packed, listed itself).
func listedThenPacked(listed, packed []SandboxEntry) []SandboxEntry {
	if len(packed) == 0 {
		return listed
	}
	return append(slices.Clip(listed), packed...)
}

// ShardOf is the index of the shard, of n, that holds the sandbox id:
// FNV-1a of the ID, modulo n. Writers put an entry there, and readers
// apply an inventory's spec.sandboxChanges to it.
func ShardOf(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// MaxShardEntries is the most entries a shard holds, as spec.sandboxes'
// maxItems.
const MaxShardEntries = 4096

// MaxPackedBytes bounds spec.packed, of a shard and of an inventory's
// spec.sandboxChanges: the CRDs' maxLength (in characters, which a
// byte count never undercounts). vk-sandbox holds the text as stored,
// each quote and backslash escaped again, to it, which leaves room within
// etcd's request limit (1.5 MiB) for the rest of the object.
const MaxPackedBytes = 1 << 20

// ShardName is the name of node's shard index. A node's name may be at
// most 249 characters for it to have shards (an object's name is at most
// 253).
func ShardName(node string, index int) string {
	return node + "-s" + strconv.Itoa(index)
}

// CompareSandboxIDs orders entries by ID, the order a host lists its
// sandboxes in (and the one a reader's join relies on).
func CompareSandboxIDs(a, b SandboxEntry) int { return strings.Compare(a.ID, b.ID) }

// ShardNode is the node a shard's name (ShardName) is of, if it is one.
func ShardNode(name string) (string, bool) {
	i := strings.LastIndex(name, "-s")
	if i <= 0 {
		return "", false
	}
	k, err := strconv.Atoi(name[i+2:])
	if err != nil || k < 0 || ShardName(name[:i], k) != name {
		return "", false
	}
	return name[:i], true
}

// MaxShardedNodeName is the longest node name whose shards have valid
// names.
const MaxShardedNodeName = 249

// NodeInventoryShardList is a list of NodeInventoryShard.
//
// +kubebuilder:object:root=true
type NodeInventoryShardList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the shards.
	Items []NodeInventoryShard `json:"items"`
}
