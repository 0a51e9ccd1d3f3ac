//go:build tools

// Package k8s pins the Kubernetes commands that hack/kube/build.sh builds.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
