// Package api is the root of the skiff.dev API module; the types live in
// v1beta1 and the generated CRDs in crds.
package api

//go:generate ../bin/controller-gen object paths=./v1beta1/...
//go:generate ../bin/controller-gen crd:crdVersions=v1 paths=./v1beta1/... output:crd:dir=./crds
