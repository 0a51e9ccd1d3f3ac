package v1beta1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeInventoryResource is the plural resource name of NodeInventory.
const NodeInventoryResource = "nodeinventories"

// NodeInventory is one sandbox host's view of itself: where its sandboxd
// listens, what it can hold, what it holds, and every sandbox on it. Its name
// is the node name. Only that host's vk-sandbox writes it, with server-side
// apply, every publish interval (30 s by default), and stamps publishedAt on
// every write, even when nothing else changed. Its sandboxes may be split
// into NodeInventoryShard objects (spec.sandboxShards), written only when
// their own entries change, so that the stamp stays small.
//
// Readers never use an inventory directly: they read the fleet through the
// freshness filter in shared/inventory/kubeinventory, which drops an
// inventory whose publishedAt trails the newest one by more than the stale
// window.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ninv,categories=skiff
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`
// +kubebuilder:printcolumn:name="Sandboxes",type=integer,JSONPath=`.spec.allocated.sandboxes`
// +kubebuilder:printcolumn:name="Slots",type=integer,JSONPath=`.spec.capacity.sandboxes`
// +kubebuilder:printcolumn:name="Published",type=date,JSONPath=`.publishedAt`
// +kubebuilder:printcolumn:name="DiskPressure",type=boolean,JSONPath=`.spec.diskPressure`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeInventory struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// PublishedAt is when the host's publisher wrote this inventory. It is
	// stamped on every publish, including when nothing else changed, so that
	// readers can tell a live host from a dead one by comparing stamps with
	// each other rather than with their own clocks. A missing stamp counts as
	// fresh. The CRD must be upgraded before vk-sandbox: a CRD without this
	// field prunes it, and every node then counts as fresh.
	// +optional
	PublishedAt *metav1.Time `json:"publishedAt,omitempty"`

	// Spec is the host's inventory.
	// +required
	Spec NodeInventorySpec `json:"spec"`
}

// NodeInventorySpec describes one sandbox host.
//
// The whole object must stay well under etcd's request limit at 2,000
// sandboxes, which is why each sandbox entry is small and its metadata is
// bounded (see SandboxEntry.Metadata).
type NodeInventorySpec struct {
	// Endpoint is the host:port of this host's sandboxd (port 27777 by
	// default), which the apiserver and the envd proxy dial.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$`
	Endpoint string `json:"endpoint"`

	// Capacity is what the host can hold in all.
	// +required
	Capacity NodeCapacity `json:"capacity"`

	// Allocated is what the host's sandboxes (warm ones included) hold now.
	// +optional
	Allocated NodeCapacity `json:"allocated,omitempty"`

	// CPUAdmission is how the host admits sandboxes by CPU. Reserved (the
	// default): a sandbox's vCPUs are reserved against capacity.cpuMilli,
	// and a create past it is refused. Shared: CPU is not admitted (sandboxd
	// --cpu-overcommit 0); a sandbox's vCPUs are its limit and the
	// sandboxes share the host's cores, capacity.cpuMilli is the host's
	// CPU, and only memory and slots bound placement.
	// +optional
	// +kubebuilder:validation:Enum=Reserved;Shared
	CPUAdmission CPUAdmission `json:"cpuAdmission,omitempty"`

	// DiskPressure is set while the filesystem of the host's sandboxes and
	// snapshots has less free space than the host's reserve (sandboxd
	// --disk-reserve). The host then refuses what would write more there
	// (creates, warm sandboxes, snapshots, forks, pulls, pauses to disk),
	// and placement leaves it out, as kube-scheduler leaves out a node
	// with DiskPressure; its sandboxes go on, and its warm ones can be
	// claimed. sandboxd measures it at start, every 10 s and on a
	// refusal.
	// +optional
	DiskPressure bool `json:"diskPressure,omitempty"`

	// VolumeDiskPressure is set while the filesystem of the host's volume
	// store is below the reserve: the host refuses new volumes, and the
	// apiserver asks it for one only when no other host takes it.
	// +optional
	VolumeDiskPressure bool `json:"volumeDiskPressure,omitempty"`

	// EnvdVersion is the version of the envd the host starts sandboxes
	// with; a sandbox entry names its own only when it differs.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	EnvdVersion string `json:"envdVersion,omitempty"`

	// Templates are the templates this host can start, each at one version.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Templates []TemplateVersion `json:"templates,omitempty"`

	// Pools summarises the warm pools that keep warm sandboxes on this host.
	// +optional
	// +listType=map
	// +listMapKey=pool
	// +kubebuilder:validation:MaxItems=256
	Pools []PoolSummary `json:"pools,omitempty"`

	// SandboxShards is how many NodeInventoryShard objects hold this
	// host's sandboxes (named ShardName(node, 0..SandboxShards-1)); 0: they
	// are all in Sandboxes. A sharded inventory keeps Sandboxes empty, so
	// that its stamp every interval writes a few hundred bytes; readers
	// join the shards into Sandboxes (shared/inventory/kubeinventory).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	SandboxShards int32 `json:"sandboxShards,omitempty"`

	// ShardsResourceVersion is the resourceVersion of the newest shard
	// write the host's publisher made before writing this inventory. The
	// shards and the inventory reach a reader through two watches, in no
	// set order between them; a reader none of whose shards of this host
	// is as new has not seen the host's last shard writes yet (a fold),
	// and keeps the host's sandboxes as it last joined them until it has
	// (for a publish interval at the most), rather than join the
	// inventory with shards older than it (shared/inventory/kubeinventory).
	// Empty: not known (the first write, which comes before the shards
	// that name it as their owner, or a host older than the field). The
	// first write after the inventory was deleted and made again names
	// the shard writes of the one before, which the new shards' are newer
	// than.
	// +optional
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:Pattern=`^[0-9]*$`
	ShardsResourceVersion string `json:"shardsResourceVersion,omitempty"`

	// SandboxChanges are changes to the shards' sandboxes that the host
	// has not written to its shards yet. A sharded host publishes a change
	// here, in the inventory it writes on every publish anyway, rather than
	// by rewriting every shard the change touches, and folds the changes
	// into its shards when they grow past its bound (vk-sandbox
	// --publish-max-changes) or when it has nothing newer to publish.
	// Readers apply them on top of the shards' entries
	// (shared/inventory/kubeinventory). Only with SandboxShards > 0.
	// +optional
	SandboxChanges *SandboxChanges `json:"sandboxChanges,omitempty"`

	// Sandboxes lists every sandbox on the host: running, paused and warm.
	// The list is atomic: its one writer, the host's vk-sandbox, replaces it
	// whole on every publish, so server-side apply tracks it as one field.
	// Tracked per entry, its managed fields would add about 290 bytes per
	// sandbox and take 2,000 sandboxes past etcd's 1.5 MiB request limit.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	Sandboxes []SandboxEntry `json:"sandboxes,omitempty"`

	// Snapshots lists the snapshots this host holds, of every team: those
	// it took and those it pulled from another host, so that a sandbox
	// from one is placed where its files are. Atomic, as Sandboxes. A host
	// with more than 1,024 lists its newest 1,024.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1024
	Snapshots []SnapshotEntry `json:"snapshots,omitempty"`

	// Volumes lists the volumes of this host's own store, of every team,
	// so that a sandbox that mounts one is placed where it is. A host of
	// a shared store (SharedVolumeStore) lists none: every host of that
	// store serves each of its volumes. Atomic, as Sandboxes. A host with
	// more than 1,024 lists its first 1,024 by ID.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1024
	Volumes []VolumeEntry `json:"volumes,omitempty"`

	// SharedVolumeStore is the ID of the volume store this host shares
	// with others (sandboxd --volume-shared, a filesystem every such host
	// mounts); empty when its volumes are its own.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SharedVolumeStore string `json:"sharedVolumeStore,omitempty"`
}

// SandboxChanges are the changes to a sharded host's sandboxes since its
// shards were written. Each applies to the shard its ID falls in
// (ShardOf(id, spec.sandboxShards)), and only while that shard's
// spec.fold is at most Fold: a shard the host rewrote since holds the
// change already, and newer ones.
type SandboxChanges struct {
	// Fold is the number of the host's fold these changes are on top of:
	// the newest spec.fold of its shards when they were written.
	// +required
	// +kubebuilder:validation:Minimum=0
	Fold int64 `json:"fold"`

	// Sandboxes are entries that replace the shard's entry of the same ID,
	// or join the shard when it has none (as NodeInventorySpec.Sandboxes).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	Sandboxes []SandboxEntry `json:"sandboxes,omitempty"`

	// Packed holds more such entries as one JSON array of SandboxEntry,
	// as NodeInventoryShardSpec.Packed (what vk-sandbox writes).
	// +optional
	// +kubebuilder:validation:MaxLength=1048576
	Packed string `json:"packed,omitempty"`

	// Removed are the IDs of the sandboxes gone from the shards.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]{20}$`
	Removed []string `json:"removed,omitempty"`
}

// Entries returns the changed entries: c.Sandboxes, then the entries of
// c.Packed that pass SandboxEntry.Validate, with an error for those it
// dropped. It never writes to c.Sandboxes.
func (c *SandboxChanges) Entries() ([]SandboxEntry, error) {
	return c.EntriesUnpackedBy(UnpackSandboxes)
}

// EntriesUnpackedBy is Entries with unpack decoding c.Packed into its
// valid entries (as a reader that keeps what it decoded of the last
// version does).
func (c *SandboxChanges) EntriesUnpackedBy(unpack func(packed string) ([]SandboxEntry, error)) ([]SandboxEntry, error) {
	packed, err := unpack(c.Packed)
	if err != nil {
		err = fmt.Errorf("spec.sandboxChanges.packed: %w", err)
	}
	return listedThenPacked(c.Sandboxes, packed), err
}

// Empty reports whether c changes nothing (nil included).
func (c *SandboxChanges) Empty() bool {
	return c == nil || len(c.Sandboxes) == 0 && c.Packed == "" && len(c.Removed) == 0
}

// CPUAdmission is how a host admits sandboxes by CPU.
type CPUAdmission string

const (
	// CPUReserved means a sandbox's vCPUs are a reservation against the host's
	// CPU capacity. An empty CPUAdmission means this.
	CPUReserved CPUAdmission = "Reserved"
	// CPUShared means CPU is not admitted: a sandbox's vCPUs are its limit.
	CPUShared CPUAdmission = "Shared"
)

// MaxInventoryVolumes is the most volumes one inventory lists.
const MaxInventoryVolumes = 1024

// VolumeEntry is one volume a host's own store holds.
type VolumeEntry struct {
	// ID is the volume's ID, a UUID.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	ID string `json:"id"`

	// Team is the namespace of the team that owns the volume.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Team string `json:"team"`

	// Name is the volume's name, unique in its team.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=250
	Name string `json:"name"`
}

// MaxInventorySnapshots is the most snapshots one inventory lists, so
// that an inventory of 2,000 sandboxes and as many snapshots stays under
// etcd's request limit.
const MaxInventorySnapshots = 1024

// SnapshotEntry is one snapshot a host holds.
type SnapshotEntry struct {
	// ID is the snapshot ID: 20 characters of [a-z0-9], carrying the tag of
	// the host that took it. A pulled copy keeps it.
	// +required
	// +kubebuilder:validation:Pattern=`^[a-z0-9]{20}$`
	ID string `json:"id"`

	// Team is the namespace of the team that owns the snapshot.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Team string `json:"team"`

	// Name and Tag are the name it was taken with, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Tag string `json:"tag,omitempty"`

	// Memory: this host's copy keeps the source's memory and processes,
	// which it restores.
	// +optional
	Memory bool `json:"memory,omitempty"`

	// PulledFrom is the node this host pulled it from; empty on the host
	// that took it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PulledFrom string `json:"pulledFrom,omitempty"`
}

// NodeCapacity is an amount of host resources: what a host has, or what its
// sandboxes hold. Its fields are always serialised, zeros included: an
// allocation that returns to zero must stay an object under server-side
// apply (all fields omitted, the merge would make it null, which the schema
// refuses).
type NodeCapacity struct {
	// CPUMilli is CPU in thousandths of a core.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CPUMilli int64 `json:"cpuMilli"`

	// MemoryMiB is memory in mebibytes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MemoryMiB int64 `json:"memoryMiB"`

	// Sandboxes is a number of sandbox slots.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Sandboxes int32 `json:"sandboxes"`
}

// TemplateVersion names a template and the version of its root filesystem
// that a host holds.
type TemplateVersion struct {
	// Name is the SandboxTemplate's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// Version identifies the template's root filesystem (a digest or a
	// generation); two hosts with the same version start the same files.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
}

// PoolSummary is one warm pool's footprint on a host.
type PoolSummary struct {
	// Pool is the SandboxWarmPool, as namespace/name.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$`
	Pool string `json:"pool"`

	// Template is the template the pool keeps warm.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Template string `json:"template"`

	// Warm is how many of the pool's warm sandboxes are ready on this host.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Warm int32 `json:"warm,omitempty"`

	// Target is how many warm sandboxes the pool wants on this host.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Target int32 `json:"target,omitempty"`
}

// SandboxState is the life-cycle state of a sandbox on its host.
// +kubebuilder:validation:Enum=running;paused;warm
type SandboxState string

const (
	// SandboxRunning is a sandbox that belongs to a team and runs.
	SandboxRunning SandboxState = "running"
	// SandboxPaused is a sandbox whose processes are frozen or checkpointed;
	// a resume brings it back.
	SandboxPaused SandboxState = "paused"
	// SandboxWarm is a started sandbox with envd ready that belongs to no one
	// yet; a claim hands it to a team.
	SandboxWarm SandboxState = "warm"
)

// SandboxEntry is what a list or watch of sandboxes needs to know about one
// sandbox, kept small so that 2,000 of them fit in one inventory.
// +kubebuilder:validation:XValidation:rule="self.state == 'warm' || has(self.team)",message="a running or paused sandbox belongs to a team"
type SandboxEntry struct {
	// ID is the sandbox ID: 20 characters of [a-z0-9], carrying the node tag.
	// +required
	// +kubebuilder:validation:Pattern=`^[a-z0-9]{20}$`
	ID string `json:"id"`

	// Template is the SandboxTemplate the sandbox was started from.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Template string `json:"template"`

	// State is running, paused or warm.
	// +required
	State SandboxState `json:"state"`

	// Pool is the warm pool (namespace/name) that started the sandbox, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	Pool string `json:"pool,omitempty"`

	// Team is the namespace of the team that owns the sandbox; empty while
	// the sandbox is warm.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Team string `json:"team,omitempty"`

	// StartedAt is when the sandbox started (for a claimed warm sandbox: when
	// it was claimed), to the microsecond, so that sandboxes started in the
	// same second list in the order they started (older hosts wrote whole
	// seconds, which readers take as well).
	// +required
	StartedAt MicroTime `json:"startedAt"`

	// EndAt is the sandbox's deadline: its host kills (or, with auto-pause,
	// pauses) it then. To the microsecond, as StartedAt. Unset for a warm
	// sandbox.
	// +optional
	EndAt *MicroTime `json:"endAt,omitempty"`

	// PausedAt is when a paused sandbox was paused (e2b's API reports it
	// as a paused sandbox's end). Unset while it runs.
	// +optional
	PausedAt *MicroTime `json:"pausedAt,omitempty"`

	// CPUMilli is the CPU the sandbox holds, in thousandths of a core.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CPUMilli int64 `json:"cpuMilli,omitempty"`

	// MemoryMiB is the memory the sandbox holds, in mebibytes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MemoryMiB int64 `json:"memoryMiB,omitempty"`

	// DiskMiB is the sandbox's writable disk, in mebibytes; 0 when it has
	// none of its own.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DiskMiB int64 `json:"diskMiB,omitempty"`

	// EnvdVersion is the version of the sandbox's envd when it is not the
	// node's (spec.envdVersion): a sandbox started before the host's envd
	// was upgraded.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	EnvdVersion string `json:"envdVersion,omitempty"`

	// Metadata is the e2b metadata the sandbox was created with. It is
	// bounded, so that an inventory of 2,000 sandboxes stays near 1 MiB: at
	// most 8 entries, keys of at most 64 bytes, and at most
	// MaxSandboxMetadataBytes bytes of keys and values together.
	// +optional
	// +kubebuilder:validation:MaxProperties=8
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 64)",message="metadata keys are at most 64 bytes"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 192)",message="metadata values are at most 192 bytes"
	// +kubebuilder:validation:XValidation:rule="self.map(k, size(k) + size(self[k])).sum() <= 192",message="metadata keys and values are at most 192 bytes together"
	Metadata map[string]string `json:"metadata,omitempty"`
}

// MaxEnvdVersionLength bounds SandboxEntry.EnvdVersion, in characters, as
// its schema's maxLength does.
const MaxEnvdVersionLength = 32

// MaxSandboxMetadataBytes bounds the bytes of keys and values together in
// SandboxEntry.Metadata; the CRD enforces it.
const MaxSandboxMetadataBytes = 192

// NodeInventoryList is a list of NodeInventory.
//
// +kubebuilder:object:root=true
type NodeInventoryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the inventories, one per node.
	Items []NodeInventory `json:"items"`
}
