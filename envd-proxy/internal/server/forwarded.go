package server

import (
	"net/http"
	"net/netip"
	"strings"
)

// Behind a reverse proxy (an L7 ingress) every client reaches the proxy
// over the ingress's pooled connections, so counting connections by their
// peer caps every client together. Connections from a trusted proxy
// (Config.TrustedProxies) are therefore not counted; each request on one
// counts instead, while it is in flight, for the client X-Forwarded-For
// names: the rightmost address in it that is not a trusted proxy's (those
// to its left are whatever the client sent). An HTTP/1.1 request in flight
// holds one of the ingress's connections to the proxy, so the cap bounds
// what one client can hold either way.

// trusted reports whether addr is one of prefixes'.
func trusted(addr netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// forwardedClient is the client of r, which arrived from peer, a trusted
// proxy: the rightmost X-Forwarded-For address that is not trusted, or
// the leftmost when all are; peer itself when the header names none it
// can read (a proxy that does not set it).
func forwardedClient(r *http.Request, peer netip.Addr, prefixes []netip.Prefix) netip.Addr {
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		addr, ok := parseHop(hops[i])
		if !ok {
			break // nothing left of a hop it cannot read is worth more
		}
		client = addr
		if !trusted(addr, prefixes) {
			break
		}
	}
	return client
}

// parseHop reads one X-Forwarded-For entry: an address, perhaps in
// brackets or with a port ("1.2.3.4:5", "[::1]", "[::1]:5"), IPv4-mapped
// IPv6 unmapped and a zone dropped (a prefix never contains a zoned
// address).
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}
