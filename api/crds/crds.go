// Package crds embeds the CustomResourceDefinitions of skiff.dev, generated
// from ../v1beta1 by controller-gen. This folder is the only copy: the chart
// and the test control plane both install from it.
package crds

import "embed"

// FS holds one YAML file per CustomResourceDefinition.
//
//go:embed *.yaml
var FS embed.FS
