package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Sandbox is one sandbox on one host of the fleet, as that host's fresh
// NodeInventory lists it. Its name is the sandbox ID (the e2b sandboxID), its
// namespace the team that owns it; a warm sandbox, which no team owns yet,
// is in the namespace of the SandboxWarmPool that started it.
//
// Sandboxes are read-only but for delete, which kills the sandbox on its
// host. They are created through the e2b API (or by a warm pool).
//
// +kubebuilder:object:root=true
type Sandbox struct {
	metav1.TypeMeta `json:",inline"`
	// metadata.name is the sandbox ID; metadata.labels are the sandbox's e2b
	// metadata entries that are valid labels (all of them are in
	// spec.metadata).
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the sandbox was started as.
	// +optional
	Spec SandboxSpec `json:"spec,omitempty"`

	// Status is what the sandbox is doing, as its host last published.
	// +optional
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is what a sandbox was started as.
type SandboxSpec struct {
	// Template is the SandboxTemplate the sandbox was started from.
	Template string `json:"template"`

	// NodeName is the host (the name of its NodeInventory) the sandbox runs on.
	NodeName string `json:"nodeName"`

	// Resources are the CPU and memory the sandbox holds.
	// +optional
	Resources SandboxResources `json:"resources,omitempty"`

	// EndAt is the sandbox's deadline: its host kills it (or, with
	// auto-pause, pauses it) then, in microseconds (as the host's
	// NodeInventory has it). Unset for a warm sandbox.
	// +optional
	EndAt *metav1.MicroTime `json:"endAt,omitempty"`

	// Pool is the SandboxWarmPool (namespace/name) that started the sandbox,
	// if a warm pool did.
	// +optional
	Pool string `json:"pool,omitempty"`

	// Metadata is the e2b metadata the sandbox was created (or claimed) with.
	// +optional
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SandboxResources is the CPU and memory one sandbox holds.
type SandboxResources struct {
	// CPUMilli is CPU in thousandths of a core.
	// +optional
	CPUMilli int64 `json:"cpuMilli,omitempty"`

	// MemoryMiB is memory in mebibytes.
	// +optional
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
}

// SandboxState is the life-cycle state of a sandbox.
type SandboxState string

const (
	// SandboxRunning is a sandbox that belongs to a team and runs.
	SandboxRunning SandboxState = "running"
	// SandboxPaused is a sandbox whose processes are frozen or
	// checkpointed; a resume brings it back.
	SandboxPaused SandboxState = "paused"
	// SandboxWarm is a started sandbox that no team owns yet; a create
	// through the e2b API claims it.
	SandboxWarm SandboxState = "warm"
)

// SandboxStatus is what a sandbox is doing.
type SandboxStatus struct {
	// State is running, paused or warm.
	// +optional
	State SandboxState `json:"state,omitempty"`

	// StartedAt is when the sandbox started (for a claimed warm sandbox:
	// when it was claimed), in microseconds (as the host's NodeInventory
	// has it); metadata.creationTimestamp is the same time in whole
	// seconds.
	// +optional
	StartedAt metav1.MicroTime `json:"startedAt,omitempty"`
}

// SandboxList is a list of Sandbox.
//
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the sandboxes.
	Items []Sandbox `json:"items"`
}

// PoolLabel is the label of the sandboxes a SandboxWarmPool started that
// are in the pool's namespace (its warm ones, and those a team of that
// namespace claimed): the pool's name. A pool's status.selector, which its
// scale subresource reports (an HPA needs one), is PoolLabel=<name>. The
// label is the pool's: e2b metadata of that key is not made a label.
const PoolLabel = "skiff.dev/pool"

// Field selectors a list or watch of sandboxes accepts, beside
// metadata.name and metadata.namespace.
const (
	FieldNodeName = "spec.nodeName"
	FieldState    = "status.state"
	FieldTemplate = "spec.template"
)
