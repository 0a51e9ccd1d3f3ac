package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
)

// The router namespace sits between the sandboxes and the host. The host
// ends of the sandboxes' veth pairs live in it, not in the host's
// namespace, and one lasting veth pair links it to the host.
//
// Why: when an interface goes down in a namespace that has
// connection-tracking entries, the kernel's masquerade notifier walks the
// whole conntrack table (every bucket, 262,144 on a host with 24 GiB) to
// forget the connections masqueraded through it. With the host ends in the
// host's namespace, every sandbox's end cost one such walk, 6 to 8% of the
// host's CPU in a create-run-kill benchmark. The router namespace has no
// stateful rules, so no conntrack entries, and the kernel skips the walk.
//
// Its rules (table routerTable, family inet) are stateless: a packet from a
// sandbox is dropped when it goes to another sandbox, is not IPv4, or has
// a source address not routed back through the interface it came in on;
// nothing from a sandbox reaches the router itself. Everything else goes
// to the host, whose table (rules.go) decides as before: it knows the
// host's end of the link as a sandbox interface, since its name starts
// with IfacePrefix.
//
// The link is addressed with link-local addresses, hostLinkAddr on the
// host's end and routerLinkAddr on the router's, and routed on-link: the
// host routes the pool to the router, the router routes everything else
// to the host. What the host itself sends to a sandbox (sandboxd to envd)
// comes from hostLinkAddr.
const (
	// routerFile is the router namespace's file in RunDir/netns: a name
	// that is no sandbox ID (List skips it).
	routerFile = ".router"
	// routerUplink is the router's end of its link to the host: upper
	// case, which no IfacePrefix has, so its rules never take it for a
	// sandbox's.
	routerUplink = "UPLINK"
	// hostLinkSuffix ends the name of the host's end, after IfacePrefix.
	hostLinkSuffix = "-rt"
	// routerTable is the router namespace's nftables table.
	routerTable = "skiff-router"
)

var (
	hostLinkAddr   = netip.MustParseAddr("169.254.77.1")
	routerLinkAddr = netip.MustParseAddr("169.254.77.2")
)

func (m *Manager) routerPath() string { return filepath.Join(m.nsDir, routerFile) }

// hostLink is the name of the host's end of the link to the router.
func (m *Manager) hostLink() string { return m.prefix + hostLinkSuffix }

// routerHandle returns a netlink handle in the router namespace and the
// namespace; the caller closes both.
func (m *Manager) routerHandle() (*netlink.Handle, netns.NsHandle, error) {
	ns, err := netns.GetFromPath(m.routerPath())
	if err != nil {
		return nil, netns.None(), fmt.Errorf("open the router namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		_ = ns.Close()
		return nil, netns.None(), fmt.Errorf("netlink in the router namespace: %w", err)
	}
	return h, ns, nil
}

// ErrNetworksLost is returned, wrapped, by Init when it found the router
// namespace gone while sandboxes still had namespaces and no interface on
// the host either: their interfaces went with the router (its file was
// unmounted while they ran). Init has done the rest of its work; those
// sandboxes reach nothing, and nothing reaches them, until torn down.
var ErrNetworksLost = errors.New("the router namespace was gone: sandboxes lost their network")

// initRouter makes the router namespace and its link to the host, or finds
// them (sandboxd restarted; the sandboxes' interfaces in it stay), and
// sets their addresses, routes, settings and rules again. It returns the
// sandboxes whose interfaces a router it had to make again took with it.
func (m *Manager) initRouter() (lost []string, err error) {
	path := m.routerPath()
	if !isNSMount(path) {
		// Sandboxes of a sandboxd before the router namespace have their
		// host ends in the host's namespace, and lost nothing.
		ids, err := m.List()
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if _, err := netlink.LinkByName(m.hostIface(id)); err != nil {
				lost = append(lost, id)
			}
		}
		if err := removeNS(path); err != nil {
			return nil, err
		}
		// The link of a router namespace that is gone (its file was
		// unmounted: a reboot of the host, make up's stop) lingers until
		// the kernel has destroyed that namespace, which it does in the
		// background.
		if err := deleteLink(&netlink.Handle{}, m.hostLink()); err != nil {
			return nil, fmt.Errorf("delete the link %s of a router namespace gone: %w", m.hostLink(), err)
		}
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			return nil, fmt.Errorf("create the router namespace's file: %w", err)
		}
		_ = f.Close()
		err = onNSThread(
			func() error { return unix.Unshare(unix.CLONE_NEWNET) },
			func(netns.NsHandle) error {
				return unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
			},
		)
		if err != nil {
			_ = removeNS(path)
			return nil, fmt.Errorf("create the router namespace: %w", err)
		}
	}
	err = onNSThread(enterPath(path), func(hostNS netns.NsHandle) error { return m.configureRouter(hostNS) })
	if err != nil {
		return nil, fmt.Errorf("set up the router namespace: %w", err)
	}
	if err := m.configureHostLink(); err != nil {
		return nil, fmt.Errorf("set up the router's link %s: %w", m.hostLink(), err)
	}
	if err := m.writeRouterRules(); err != nil {
		return nil, fmt.Errorf("install the router namespace's nftables table: %w", err)
	}
	return lost, nil
}

// configureRouter runs on a thread in the router namespace: its settings,
// lo, its end of the link (made with the host's end in hostNS if missing)
// and its default route to the host.
func (m *Manager) configureRouter(hostNS netns.NsHandle) error {
	in, err := setUpNamespace([]sysctl{
		{"net/ipv4/ip_forward", "1"},
		// No IPv6 on any interface: sandboxes have IPv4 only.
		{"net/ipv6/conf/all/disable_ipv6", "1"},
		{"net/ipv6/conf/default/disable_ipv6", "1"},
	})
	if err != nil {
		return err
	}
	defer in.Close()
	up, err := in.LinkByName(routerUplink)
	if _, ok := errors.AsType[netlink.LinkNotFoundError](err); ok {
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU = routerUplink, m.mtu
		veth := netlink.NewVeth(attrs)
		veth.PeerName, veth.PeerNamespace = m.hostLink(), netlink.NsFd(hostNS)
		if err := in.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth pair %s: %w", m.hostLink(), err)
		}
		up, err = in.LinkByName(routerUplink)
	}
	if err != nil {
		return fmt.Errorf("find %s: %w", routerUplink, err)
	}
	if m.mtu > 0 && up.Attrs().MTU != m.mtu {
		if err := in.LinkSetMTU(up, m.mtu); err != nil {
			return fmt.Errorf("set the MTU of %s: %w", routerUplink, err)
		}
	}
	if err := in.AddrReplace(up, &netlink.Addr{IPNet: hostRoute(routerLinkAddr)}); err != nil {
		return fmt.Errorf("address %s: %w", routerUplink, err)
	}
	if err := in.LinkSetUp(up); err != nil {
		return fmt.Errorf("bring up %s: %w", routerUplink, err)
	}
	err = in.RouteReplace(&netlink.Route{
		LinkIndex: up.Attrs().Index, Gw: hostLinkAddr.AsSlice(), Flags: int(netlink.FLAG_ONLINK),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
	})
	if err != nil {
		return fmt.Errorf("add the router's default route: %w", err)
	}
	// An address of the pool that no sandbox has is unreachable here (an
	// ICMP error at once), rather than sent back to the host by the
	// default route; the sandboxes' /30s are more specific.
	err = in.RouteReplace(&netlink.Route{Type: unix.RTN_UNREACHABLE, Dst: poolNet(m.pool)})
	if err != nil {
		return fmt.Errorf("add the pool's unreachable route: %w", err)
	}
	return nil
}

// configureHostLink addresses and brings up the host's end of the link,
// and routes the pool through it.
func (m *Manager) configureHostLink() error {
	link, err := netlink.LinkByName(m.hostLink())
	if err != nil {
		return err
	}
	// No IPv6 address, whose removal would cost a walk of the conntrack
	// table (network.go).
	if err := netlink.LinkSetIP6AddrGenMode(link, addrGenModeNone); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("turn off IPv6 addresses: %w", err)
	}
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: hostRoute(hostLinkAddr)}); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	// The egress filters listen on the host's loopback, where its rules
	// send some of the sandboxes' traffic (policy.go): a packet that came
	// in here is routed to 127.0.0.1 only with route_localnet.
	if err := writeSysctl("net/ipv4/conf/"+m.hostLink()+"/route_localnet", "1"); err != nil {
		return err
	}
	if m.mtu > 0 && link.Attrs().MTU != m.mtu {
		if err := netlink.LinkSetMTU(link, m.mtu); err != nil {
			return fmt.Errorf("set the MTU: %w", err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up: %w", err)
	}
	err = netlink.RouteReplace(&netlink.Route{
		LinkIndex: link.Attrs().Index, Gw: routerLinkAddr.AsSlice(), Flags: int(netlink.FLAG_ONLINK),
		Src: hostLinkAddr.AsSlice(), Dst: poolNet(m.pool),
	})
	if err != nil {
		return fmt.Errorf("route %s to the router: %w", m.pool, err)
	}
	// A route of an earlier --sandbox-cidr goes.
	routes, err := netlink.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if r.Gw != nil && r.Gw.Equal(routerLinkAddr.AsSlice()) && r.Dst != nil && r.Dst.String() != m.pool.String() {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("remove the route of %s: %w", r.Dst, err)
			}
		}
	}
	return nil
}

func poolNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// writeRouterRules replaces the router namespace's table: stateless rules
// only, which make no conntrack entries.
func (m *Manager) writeRouterRules() error {
	ns, err := netns.GetFromPath(m.routerPath())
	if err != nil {
		return err
	}
	defer ns.Close()
	cc, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	forward, input, add := replaceTable(cc, &nftables.Table{Name: routerTable, Family: nftables.TableFamilyINet})
	fromSandbox, toSandbox := ifname(expr.MetaKeyIIFNAME, m.prefix), ifname(expr.MetaKeyOIFNAME, m.prefix)
	drop := verdict(expr.VerdictDrop, "")
	add(forward, fromSandbox, toSandbox, drop)
	add(forward, fromSandbox, notIPv4(), drop)
	add(forward, fromSandbox, spoofed(), drop)
	add(input, fromSandbox, drop)
	return cc.Flush()
}

// removeRouter deletes the link to the router (and with it the router's
// end) and the router namespace's file, the one thing that keeps the
// namespace: the kernel then destroys it, with any sandbox interface still
// in it. (So does unmounting RunDir/netns while sandboxes run: their
// networks go with it, and a new Init makes an empty router.)
func (m *Manager) removeRouter() error {
	var errs []error
	if err := deleteLink(&netlink.Handle{}, m.hostLink()); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", m.hostLink(), err))
	}
	if err := removeNS(m.routerPath()); err != nil {
		errs = append(errs, fmt.Errorf("remove the router namespace: %w", err))
	}
	return errors.Join(errs...)
}

// isNSMount reports whether path is a namespace's bind mount (not the
// empty file it is mounted on).
func isNSMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

func hostRoute(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

// deleteStale deletes the veth pair of an earlier sandbox that still holds
// block b in the router: Teardown leaves a pair to its namespace's end,
// and a namespace that something still holds keeps it.
func (m *Manager) deleteStale(router *netlink.Handle, b ipam.Block) error {
	routes, err := router.RouteGet(b.Sandbox.AsSlice())
	if err != nil {
		return nil // unreachable: no pair has the block
	}
	for _, r := range routes {
		link, err := router.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		if name := link.Attrs().Name; strings.HasPrefix(name, m.prefix) {
			if err := deleteLink(router, name); err != nil {
				return fmt.Errorf("delete the stale veth pair %s holding %s: %w", name, b.Prefix, err)
			}
		}
	}
	return nil
}
