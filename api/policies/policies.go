// Package policies embeds what binds each NodeInventory to its host on the
// kube-apiserver: a ValidatingAdmissionPolicy (CEL) and its binding, which
// let a sandbox host's identity write only the inventory named after it,
// and the RBAC that lets the hosts' group publish at all. This folder is the
// only copy: the chart and the test control plane install these same bytes.
//
// A host's identity is the one a per-host client certificate gives, the way
// a kubelet is system:node:<name> in system:nodes: user
// skiff:node:<node-name> (the certificate's CN) in group skiff:nodes (its O).
package policies

import "embed"

// FS holds one YAML file per object: the policy, its binding, the
// ClusterRole and the ClusterRoleBinding.
//
//go:embed *.yaml
var FS embed.FS

const (
	// NodeUserPrefix starts the user name of every sandbox host; the rest is
	// the node's name (the name of its NodeInventory).
	NodeUserPrefix = "skiff:node:"
	// NodesGroup is the group every sandbox host is in.
	NodesGroup = "skiff:nodes"
	// PolicyName names the ValidatingAdmissionPolicy and its binding.
	PolicyName = "nodeinventory-owner.skiff.dev"
)

// NodeUser is the user name of the host whose node is named node: the CN of
// its client certificate.
func NodeUser(node string) string { return NodeUserPrefix + node }
