package e2bapi

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"

	"golang.org/x/net/idna"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/egress"
)

// Metadata bounds: a sandbox's metadata is stored in its node's
// NodeInventory, whose CRD bounds it (api/v1beta1 SandboxEntry.Metadata) so
// that an inventory of 2,000 sandboxes stays near 1 MiB. A create that
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

// networkBody is e2b's SandboxNetworkConfig. Skiff enforces the outbound
// rules (allowOut, denyOut), private traffic (allowPublicTraffic=false) and
// maskRequestHost; e2b's egressProxy and transform rules are refused with
// 501 rather than ignored.
type networkBody struct {
	AllowPublicTraffic *bool                      `json:"allowPublicTraffic"`
	AllowOut           []string                   `json:"allowOut"`
	DenyOut            []string                   `json:"denyOut"`
	MaskRequestHost    *string                    `json:"maskRequestHost"`
	EgressProxy        map[string]json.RawMessage `json:"egressProxy"`
	Rules              map[string]json.RawMessage `json:"rules"`
}

// check validates a create's network in e2b's order (maskRequestHost, the
// outbound rules) with e2b's messages (400), then refuses what Skiff does
// not do (501).
func (n *networkBody) check() error {
	if n == nil {
		return nil
	}
	if n.MaskRequestHost != nil {
		if err := validateMaskRequestHost(*n.MaskRequestHost); err != nil {
			return err
		}
	}
	return checkEgress(n.AllowOut, n.DenyOut, n.EgressProxy, n.Rules)
}

// checkEgress validates outbound rules as e2b's API does (create and
// PUT /sandboxes/{id}/network), then refuses an egress proxy or transform
// rules with 501. An empty rules object is nothing.
func checkEgress(allowOut, denyOut []string, proxy, rules map[string]json.RawMessage) error {
	if err := egress.Validate(allowOut, denyOut); err != nil {
		return Invalid("", "%v", err)
	}
	switch {
	case proxy != nil:
		return unsupported("network.egressProxy (a SOCKS5 proxy of the user's)")
	case len(rules) > 0:
		return unsupported("network.rules (header transforms)")
	}
	return nil
}

// maxMaskRequestHost bounds maskRequestHost, a Host header.
const maxMaskRequestHost = 255

// validateMaskRequestHost is e2b's check: a host with an optional port (the
// port is not checked, so "${PORT}" passes), in ASCII.
func validateMaskRequestHost(v string) error {
	if len(v) > maxMaskRequestHost {
		return Invalid("", "mask request host is not valid: %s (longer than %d bytes)", echo(v), maxMaskRequestHost)
	}
	host, _, err := net.SplitHostPort(v)
	if err != nil {
		if !strings.Contains(err.Error(), "missing port") {
			return Invalid("", "mask request host is not valid: %s", v)
		}
		host = v
	}
	ascii, err := idna.Display.ToASCII(host)
	if err != nil {
		return Invalid("", "mask request host is not valid: %s", v)
	}
	if !strings.EqualFold(ascii, host) {
		return Invalid("", "mask request host '%s' is not ASCII. Please use ASCII characters only.", host)
	}
	return nil
}

// publicTraffic is network.allowPublicTraffic: nil when not said.
func (n *networkBody) publicTraffic() *bool {
	if n == nil {
		return nil
	}
	return n.AllowPublicTraffic
}
