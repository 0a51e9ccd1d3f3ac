// Package v1beta1 holds the skiff.dev/v1beta1 custom resources: the
// NodeInventory each sandbox host publishes, and the SandboxWarmPool and
// SandboxTemplate that operators write.
//
// The package imports only k8s.io/apimachinery and k8s.io/api, so that every
// binary (publisher and readers alike) can depend on it without pulling in a
// client.
//
// +kubebuilder:object:generate=true
// +groupName=skiff.dev
package v1beta1
