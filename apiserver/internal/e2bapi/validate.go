package e2bapi

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Metadata bounds: a sandbox's metadata is stored in its node's
// NodeInventory, whose CRD bounds it (api/v1beta1 SandboxEntry.Metadata) so
// that an inventory of 2,000 sandboxes stays under 1 MiB. A create that
// would not fit is refused here, with a 400 naming "metadata", rather than
// failing later at the publisher.
const (
	maxMetadataEntries  = 8
	maxMetadataKeyBytes = 64
	maxMetadataBytes    = v1beta1.MaxSandboxMetadataBytes
)

// validateMetadata checks metadata against the NodeInventory bounds.
func validateMetadata(m map[string]string) error {
	if len(m) > maxMetadataEntries {
		return Invalid("metadata", "at most %d entries, got %d", maxMetadataEntries, len(m))
	}
	total := 0
	for k, v := range m {
		switch {
		case k == "":
			return Invalid("metadata", "keys must not be empty")
		case len(k) > maxMetadataKeyBytes:
			return Invalid("metadata", "key %s is longer than %d bytes", echo(k), maxMetadataKeyBytes)
		}
		total += len(k) + len(v)
	}
	if total > maxMetadataBytes {
		return Invalid("metadata", "keys and values are %d bytes together, at most %d", total, maxMetadataBytes)
	}
	return nil
}

// validateEnvVars refuses names a process environment cannot carry.
func validateEnvVars(m map[string]string) error {
	for k, v := range m {
		switch {
		case k == "":
			return Invalid("envVars", "names must not be empty")
		case strings.ContainsAny(k, "=\x00"):
			return Invalid("envVars", "name %s must not contain '=' or NUL", echo(k))
		case strings.ContainsRune(v, 0):
			return Invalid("envVars", "value of %s must not contain NUL", echo(k))
		}
	}
	return nil
}

// unsupported is the error for a feature Skiff does not implement (501).
func unsupported(feature string) error {
	return fmt.Errorf("%s is %w", feature, ErrUnsupported)
}

// networkBody is e2b's SandboxNetworkConfig. Skiff enforces "no internet"
// (allow_internet_access=false, or denyOut of all traffic and no allowOut)
// and private traffic (allowPublicTraffic=false); anything else is refused
// with 501 rather than ignored.
type networkBody struct {
	AllowPublicTraffic *bool                      `json:"allowPublicTraffic"`
	AllowOut           []string                   `json:"allowOut"`
	DenyOut            []string                   `json:"denyOut"`
	MaskRequestHost    *string                    `json:"maskRequestHost"`
	EgressProxy        map[string]json.RawMessage `json:"egressProxy"`
	Rules              map[string]json.RawMessage `json:"rules"`
}

// allTraffic is what e2b's SDKs put in denyOut to cut all egress.
func allTraffic(s string) bool {
	return s == "0.0.0.0/0" || s == "ALL_TRAFFIC"
}

// internet reduces a network config to the one switch Skiff has: nil
// when it says nothing about internet access, else whether it is allowed.
func (n *networkBody) internet() (*bool, error) {
	if n == nil {
		return nil, nil
	}
	switch {
	case len(n.AllowOut) > 0:
		return nil, unsupported("network.allowOut")
	case n.MaskRequestHost != nil && *n.MaskRequestHost != "":
		return nil, unsupported("network.maskRequestHost")
	case len(n.EgressProxy) > 0:
		return nil, unsupported("network.egressProxy")
	case len(n.Rules) > 0:
		return nil, unsupported("network.rules")
	}
	if len(n.DenyOut) == 0 {
		return nil, nil
	}
	for _, d := range n.DenyOut {
		if !allTraffic(d) {
			return nil, unsupported("network.denyOut of single destinations")
		}
	}
	off := false
	return &off, nil
}

// publicTraffic is network.allowPublicTraffic: nil when not said.
func (n *networkBody) publicTraffic() *bool {
	if n == nil {
		return nil
	}
	return n.AllowPublicTraffic
}
