// Package api is the root of Skiff's API module: the skiff.dev custom
// resources live in v1beta1 (their generated CRDs in crds), the aggregated
// sandbox.skiff.dev resource that sandbox-apiserver serves in
// sandbox/v1beta1.
package api

//go:generate ../bin/controller-gen object paths=./v1beta1/... paths=./sandbox/v1beta1/...
//go:generate ../bin/controller-gen crd:crdVersions=v1 paths=./v1beta1/... output:crd:dir=./crds
