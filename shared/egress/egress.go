// Package egress is a sandbox's outbound rules as e2b defines them
// (network.allowOut, network.denyOut, allow_internet_access), shared by the
// apiserver, which validates them with e2b's messages, and sandboxd, which
// enforces them.
//
// An entry of allowOut is an IPv4 address, a CIDR block or a domain name
// ("example.com", "*.example.com" for every subdomain at any depth but not
// the apex, "*" for every name); denyOut takes addresses and blocks only.
// A new connection is decided in e2b's order: an allowed domain (only where
// the name is seen: the TLS SNI on port 443, the HTTP Host on port 80), an
// allowed block, a denied block, and otherwise allowed. So allow wins over
// deny, and allowOut alone restricts nothing. allow_internet_access false
// denies all traffic, under the same allowOut. "0.0.0.0/0" is e2b's
// ALL_TRAFFIC.
package egress

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// AllTraffic is what e2b's SDKs send for ALL_TRAFFIC.
const AllTraffic = "0.0.0.0/0"

// ErrMsgDomainsRequireBlockAll is e2b's answer to allowed domains without
// a deny of all traffic.
const ErrMsgDomainsRequireBlockAll = "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic."

// Validate checks allowOut and denyOut as e2b's API does, and returns its
// message for the first fault (the caller answers it as a 400).
func Validate(allowOut, denyOut []string) error {
	for _, d := range denyOut {
		if !isSpecifiedIPOrCIDR(d) {
			return fmt.Errorf("invalid denied CIDR %s", d)
		}
	}
	if len(allowOut) == 0 {
		return nil
	}
	addrs, domains := split(allowOut)
	for _, a := range addrs {
		if !isSpecifiedIPOrCIDR(a) {
			return fmt.Errorf("invalid allowed address %s", a)
		}
	}
	if len(domains) > 0 && !slices.Contains(denyOut, AllTraffic) {
		return fmt.Errorf("%s", ErrMsgDomainsRequireBlockAll)
	}
	return nil
}

// split parts entries into addresses or blocks and (everything else)
// domains, as e2b does: a domain gets no grammar check.
func split(entries []string) (addrs, domains []string) {
	for _, e := range entries {
		if isIPOrCIDR(e) {
			addrs = append(addrs, e)
		} else {
			domains = append(domains, e)
		}
	}
	return addrs, domains
}

func isIPOrCIDR(s string) bool {
	if net.ParseIP(s) != nil {
		return true
	}
	_, _, err := net.ParseCIDR(s)
	return err == nil
}

// isSpecifiedIPOrCIDR is an address or block that is not unspecified
// (0.0.0.0, ::, 0.0.0.0/8), but for 0.0.0.0/0.
func isSpecifiedIPOrCIDR(s string) bool {
	if s == AllTraffic {
		return true
	}
	if ip := net.ParseIP(s); ip != nil {
		return !ip.IsUnspecified()
	}
	ip, _, err := net.ParseCIDR(s)
	return err == nil && !ip.IsUnspecified()
}

// Rules are the rules a sandbox is enforced by.
type Rules struct {
	// AllowCIDRs and DenyCIDRs are IPv4 blocks (a bare address is a /32).
	AllowCIDRs, DenyCIDRs []netip.Prefix
	// AllowDomains are lowercase names and patterns ("*.example.com", "*").
	AllowDomains []string
}

// Effective is what a sandbox with allowOut, denyOut (valid, see Validate)
// and internet access (nil: not said) is enforced by. IPv6 entries are
// dropped: sandboxes have no IPv6.
func Effective(allowOut, denyOut []string, internet *bool) Rules {
	var r Rules
	addrs, domains := split(allowOut)
	for _, a := range addrs {
		if p, ok := prefix(a); ok {
			r.AllowCIDRs = append(r.AllowCIDRs, p)
		}
	}
	for _, d := range domains {
		r.AllowDomains = append(r.AllowDomains, strings.ToLower(strings.TrimSuffix(d, ".")))
	}
	if internet != nil && !*internet {
		r.DenyCIDRs = []netip.Prefix{netip.MustParsePrefix(AllTraffic)}
	} else {
		for _, d := range denyOut {
			if p, ok := prefix(d); ok {
				r.DenyCIDRs = append(r.DenyCIDRs, p)
			}
		}
	}
	return r
}

// prefix is an IPv4 address (as a /32) or block, masked.
func prefix(s string) (netip.Prefix, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(a, 32), true
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

// Restricts reports whether the rules can refuse anything: without a
// denied block, every connection is allowed.
func (r Rules) Restricts() bool { return len(r.DenyCIDRs) > 0 }

// DeniesAll reports whether everything not allowed is denied.
func (r Rules) DeniesAll() bool {
	return slices.ContainsFunc(r.DenyCIDRs, func(p netip.Prefix) bool { return p.Bits() == 0 })
}

// HasDomains reports whether some allowed entries are names.
func (r Rules) HasDomains() bool { return len(r.AllowDomains) > 0 }

// AllowsName reports whether host (a name, case-insensitive, with or
// without a trailing dot) is an allowed domain.
func (r Rules) AllowsName(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return false
	}
	for _, d := range r.AllowDomains {
		switch {
		case d == "*", d == host:
			return true
		case strings.HasPrefix(d, "*.") && strings.HasSuffix(host, d[1:]):
			return true
		}
	}
	return false
}

// AllowsAddr decides a connection to addr by the blocks: allowed, denied,
// otherwise allowed.
func (r Rules) AllowsAddr(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range r.AllowCIDRs {
		if p.Contains(addr) {
			return true
		}
	}
	for _, p := range r.DenyCIDRs {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}
