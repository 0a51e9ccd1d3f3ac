package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SandboxWarmPool keeps a number of started, unclaimed sandboxes of one
// template ready across the fleet, so that a create is a claim rather than a
// cold start. One sandbox-apiserver replica (the lease holder) drives every
// pool to its target; the scale subresource lets an HPA or
// `kubectl scale` set the target. The pool's name is the value of its
// sandboxes' skiff.dev/pool label, so it is at most 63 characters.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || size(self.metadata.name) <= 63",optionalOldSelf=true,message="a pool's name is at most 63 characters: it is its sandboxes' skiff.dev/pool label"
// +kubebuilder:resource:shortName=swp,categories=skiff
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.template`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Warming",type=integer,JSONPath=`.status.warming`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the pool should hold.
	// +required
	Spec SandboxWarmPoolSpec `json:"spec"`

	// Status is what the pool holds, as the warm-pool driver last saw it.
	// +optional
	Status SandboxWarmPoolStatus `json:"status,omitempty"`
}

// SandboxWarmPoolSpec is what a warm pool should hold.
type SandboxWarmPoolSpec struct {
	// Template is the name of the SandboxTemplate to keep warm.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="template is immutable; create another pool"
	Template string `json:"template"`

	// Replicas is how many warm sandboxes to keep ready across the fleet.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Replicas *int32 `json:"replicas,omitempty"`

	// Resources overrides the template's CPU and memory for the pool's
	// sandboxes. Unset fields keep the template's values.
	// +optional
	Resources *SandboxResources `json:"resources,omitempty"`
}

// SandboxResources is the CPU and memory given to one sandbox.
type SandboxResources struct {
	// CPUMilli is CPU in thousandths of a core.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256000
	CPUMilli int64 `json:"cpuMilli,omitempty"`

	// MemoryMiB is memory in mebibytes.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
}

// SandboxWarmPoolStatus is what a warm pool holds.
type SandboxWarmPoolStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Replicas is how many warm sandboxes exist, ready or warming; the scale
	// subresource reports it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Replicas int32 `json:"replicas,omitempty"`

	// Selector is the label selector of the pool's sandboxes in its
	// namespace, skiff.dev/pool= and the pool's name, which the scale
	// subresource reports: an HPA does not scale a target without one.
	// +optional
	Selector string `json:"selector,omitempty"`

	// Ready is how many warm sandboxes have envd ready and can be claimed.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Ready int32 `json:"ready,omitempty"`

	// Warming is how many warm sandboxes are starting.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Warming int32 `json:"warming,omitempty"`

	// Conditions are the pool's conditions; Ready is true when the pool holds
	// its target.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// SandboxWarmPoolConditionReady is the condition type that is true when a pool
// holds as many ready sandboxes as its spec asks for.
const SandboxWarmPoolConditionReady = "Ready"

// SandboxWarmPoolList is a list of SandboxWarmPool.
//
// +kubebuilder:object:root=true
type SandboxWarmPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the warm pools.
	Items []SandboxWarmPool `json:"items"`
}
