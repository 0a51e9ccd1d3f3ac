package gvisor

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netState is what runsc's network stack takes from the sandbox's network
// namespace: the addresses of its interfaces but loopback (runsc removes
// them from the namespace, and the kernel the routes through them with
// them) and the routes of the main table through those interfaces.
type netState struct {
	Addrs  []netAddr  `json:"addrs,omitempty"`
	Routes []netRoute `json:"routes,omitempty"`
}

type netAddr struct {
	Link string `json:"link"`
	Addr string `json:"addr"` // CIDR
}

type netRoute struct {
	Link     string `json:"link"`
	Dst      string `json:"dst,omitempty"` // CIDR; empty for a default route
	Gw       string `json:"gw,omitempty"`
	Src      string `json:"src,omitempty"`
	Scope    uint8  `json:"scope"`
	Priority int    `json:"priority,omitempty"`
	Family   int    `json:"family"`
}

// handleAt is a netlink handle whose socket is in the network namespace at
// path.
func handleAt(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, nil
}

// saveNetwork records the addresses and routes runsc will take from the
// namespace at path.
func saveNetwork(path string) (*netState, error) {
	h, err := handleAt(path)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	names := map[int]string{}
	st := &netState{}
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 {
			continue
		}
		names[a.Index] = a.Name
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			if ad.IP.IsLinkLocalUnicast() && ad.IP.To4() == nil {
				continue // the kernel's own IPv6 link-local address
			}
			st.Addrs = append(st.Addrs, netAddr{Link: a.Name, Addr: ad.IPNet.String()})
		}
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	for _, rt := range routes {
		name, ok := names[rt.LinkIndex]
		if !ok || rt.Protocol == unix.RTPROT_KERNEL {
			continue // through loopback, or made by the kernel with an address
		}
		nr := netRoute{Link: name, Scope: uint8(rt.Scope), Priority: rt.Priority, Family: rt.Family}
		if rt.Dst != nil {
			nr.Dst = rt.Dst.String()
		}
		if rt.Gw != nil {
			nr.Gw = rt.Gw.String()
		}
		if rt.Src != nil {
			nr.Src = rt.Src.String()
		}
		st.Routes = append(st.Routes, nr)
	}
	return st, nil
}

// restoreNetwork puts back into the namespace at path the addresses and
// routes runsc took from it, for a restore to take them again.
func restoreNetwork(path string, st *netState) error {
	h, err := handleAt(path)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, a := range st.Addrs {
		link, err := h.LinkByName(a.Link)
		if err != nil {
			return fmt.Errorf("restore network: interface %s: %w", a.Link, err)
		}
		addr, err := netlink.ParseAddr(a.Addr)
		if err != nil {
			return fmt.Errorf("restore network: %w", err)
		}
		if err := h.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("restore network: address %s of %s: %w", a.Addr, a.Link, err)
		}
	}
	for _, r := range st.Routes {
		link, err := h.LinkByName(r.Link)
		if err != nil {
			return fmt.Errorf("restore network: interface %s: %w", r.Link, err)
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.Scope(r.Scope), Priority: r.Priority, Family: r.Family}
		if r.Dst != "" {
			if _, route.Dst, err = net.ParseCIDR(r.Dst); err != nil {
				return fmt.Errorf("restore network: %w", err)
			}
		}
		route.Gw, route.Src = net.ParseIP(r.Gw), net.ParseIP(r.Src)
		if err := h.RouteReplace(route); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("restore network: route %+v: %w", r, err)
		}
	}
	return nil
}
