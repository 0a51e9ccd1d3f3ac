// Package v1beta1 holds the sandbox.skiff.dev/v1beta1 API: the Sandbox
// resource that sandbox-apiserver serves through the Kubernetes aggregation
// layer (`kubectl get sandboxes`). Sandboxes are not stored in etcd: the
// apiserver derives them from the fresh NodeInventory objects, so a list or
// watch shows a host's sandboxes only while its inventory is fresh.
//
// The group is its own, apart from skiff.dev, so that the APIService that
// serves it never shadows Skiff's custom resources.
//
// +k8s:openapi-gen=true
// +k8s:openapi-model-package=dev.skiff.sandbox.v1beta1
// +kubebuilder:object:generate=true
// +groupName=sandbox.skiff.dev
package v1beta1
