package v1beta1

import (
	"strconv"

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
}

// ShardName is the name of node's shard index. A node's name may be at
// most 249 characters for it to have shards (an object's name is at most
// 253).
func ShardName(node string, index int) string {
	return node + "-s" + strconv.Itoa(index)
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
