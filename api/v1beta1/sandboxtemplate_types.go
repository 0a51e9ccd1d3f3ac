package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SandboxTemplate is what e2b calls a template: a root filesystem plus the
// resources and commands a sandbox starts with. Its name, or any of its
// aliases, is the templateID an SDK passes to create.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=stpl,categories=skiff
// +kubebuilder:printcolumn:name="CPU",type=integer,JSONPath=`.spec.cpuMilli`
// +kubebuilder:printcolumn:name="Memory",type=integer,JSONPath=`.spec.memoryMiB`
// +kubebuilder:printcolumn:name="Envd",type=string,JSONPath=`.spec.envdVersion`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec describes the template.
	// +required
	Spec SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateSpec describes a template.
type SandboxTemplateSpec struct {
	// Aliases are other names an SDK may use as the templateID.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-_.a-z0-9]*[a-z0-9])?$`
	Aliases []string `json:"aliases,omitempty"`

	// Source is where the template's root filesystem comes from.
	// +required
	Source TemplateSource `json:"source"`

	// CPUMilli is each sandbox's CPU, in thousandths of a core.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256000
	CPUMilli int64 `json:"cpuMilli,omitempty"`

	// MemoryMiB is each sandbox's memory, in mebibytes.
	// +optional
	// +kubebuilder:default=512
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	MemoryMiB int64 `json:"memoryMiB,omitempty"`

	// DiskMiB bounds each sandbox's writable layer, in mebibytes.
	// +optional
	// +kubebuilder:default=1024
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777216
	DiskMiB int64 `json:"diskMiB,omitempty"`

	// StartCommand runs in the background when a sandbox starts.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	StartCommand string `json:"startCommand,omitempty"`

	// ReadyCommand must exit 0 before a sandbox counts as ready; it is
	// retried until it does.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	ReadyCommand string `json:"readyCommand,omitempty"`

	// EnvdVersion is the envd version the template's sandboxes report to the
	// SDK (e2b SDKs change behaviour on it).
	// +optional
	// +kubebuilder:default="0.6.0"
	// +kubebuilder:validation:Pattern=`^[0-9]+\.[0-9]+\.[0-9]+$`
	EnvdVersion string `json:"envdVersion,omitempty"`
}

// TemplateSource is where a template's root filesystem comes from; exactly
// one field is set.
// +kubebuilder:validation:XValidation:rule="[has(self.image), has(self.directory), has(self.builtin)].filter(x, x).size() == 1",message="set exactly one of image, directory and builtin"
type TemplateSource struct {
	// Image is the path, on every sandbox host, of an OCI image archive
	// (a tar as `docker save` or `skopeo copy oci-archive:` writes it).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^/`
	Image string `json:"image,omitempty"`

	// Directory is the path, on every sandbox host, of a directory that is
	// the root filesystem.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^/`
	Directory string `json:"directory,omitempty"`

	// Builtin names a root filesystem that sandboxd prepares itself: "base"
	// (bash, coreutils, python3).
	// +optional
	// +kubebuilder:validation:Enum=base
	Builtin string `json:"builtin,omitempty"`
}

// SandboxTemplateList is a list of SandboxTemplate.
//
// +kubebuilder:object:root=true
type SandboxTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the templates.
	Items []SandboxTemplate `json:"items"`
}
