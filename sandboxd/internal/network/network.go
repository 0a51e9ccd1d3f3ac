// Package network gives each sandbox its own network namespace.
//
// A sandbox's namespace is bind-mounted at RunDir/netns/<id>, as `ip netns
// add` does, and linked by a veth pair to the router namespace (router.go),
// which one lasting veth pair links to the host. The host end of the
// sandbox's pair, in the router namespace, is named IfacePrefix plus a hash
// of the sandbox ID, holds the Host address of the sandbox's /30 block
// (ipam.Block) and is its gateway; the sandbox end is eth0 with the block's
// Sandbox address, and a default route through its gateway. The router
// drops, statelessly, what goes from one sandbox to another, is not IPv4
// or has a spoofed source, and passes the rest to the host. Where its
// packets may go is the host's nftables' decision alone, so that it can
// change while the sandbox runs (gVisor's netstack takes the namespace's
// routes once, when it starts).
//
// One nftables table (family inet) in the host's namespace isolates the
// sandboxes, which it knows by the name prefix of their interfaces: the
// host's end of the router's link (and the host ends of sandboxes a
// sandboxd before the router namespace set up) start with IfacePrefix:
//
//   - forward: a packet from a sandbox is dropped when it goes to another
//     sandbox or anywhere in the pool, has a source address that is not
//     routed back through the interface it came in on (spoofed), is not
//     IPv4, goes to a denied destination (DefaultDeny: the private, shared
//     and link-local ranges and the clouds' metadata addresses, and
//     Options.Deny) that is neither one of the sandboxes' resolvers on port
//     53 nor in Options.Allow, or is refused by the sandbox's own rules
//     (SetPolicy, policy.go); a sandbox without rules has its packets
//     refused (ICMP network unreachable, which it sees at once as
//     ENETUNREACH) when its address is not in the egress set: no internet
//     access. The rest is accepted, and so are packets of connections
//     already open when the rules change.
//     A packet to a sandbox passes only as a reply (established or related),
//     so nothing outside opens connections to a sandbox.
//   - input: packets from sandboxes to the host itself pass only as replies.
//     sandboxd connects into its sandboxes, but no sandbox reaches any port
//     of the host, sandboxd's admin port included.
//   - postrouting: traffic from the pool to outside it is masqueraded.
//
// Init enables IPv4 forwarding for the whole host (net.ipv4.ip_forward=1),
// without which no sandbox traffic is routed. This table does not restrict
// forwarding between the host's other interfaces, and base chains of other
// tables (for example a forward policy of drop set up by Docker) still apply
// and can drop what this table accepts.
//
// The Manager keeps no state in memory: Teardown, SetEgress and List work
// from the sandbox ID and block alone, so a restarted sandboxd sets up,
// adopts and cleans up sandboxes of its predecessor.
package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
)

const (
	// DefaultTable is the nftables table when Options.Table is empty.
	DefaultTable = "skiff"
	// DefaultIfacePrefix starts host interface names when
	// Options.IfacePrefix is empty.
	DefaultIfacePrefix = "sk"

	// maxPrefixLen leaves at least 7 hex digits (28 bits) of the ID's hash
	// in an interface name of at most 15 characters (IFNAMSIZ-1).
	maxPrefixLen = 8
	maxIfaceLen  = unix.IFNAMSIZ - 1
	maxIDLen     = 64
	// sandboxIface is the sandbox end of its veth pair.
	sandboxIface = "eth0"
	// addrGenModeNone is IN6_ADDR_GEN_MODE_NONE (linux/if_link.h): an
	// interface in this mode gets no IPv6 link-local address.
	addrGenModeNone = 1
)

// Options configure a Manager.
type Options struct {
	// RunDir holds the namespaces' bind mounts, as RunDir/netns/<id>.
	RunDir string
	// Table is the nftables table (family inet) of the rules; DefaultTable
	// if empty.
	Table string
	// IfacePrefix starts the name of every host end of a veth pair and is
	// how the rules know sandbox interfaces, so no other interface of the
	// host may start with it; DefaultIfacePrefix if empty. At most 8 of
	// [a-z0-9_-].
	IfacePrefix string
	// Pool is the IPv4 prefix the sandboxes' blocks come from.
	Pool netip.Prefix
	// MTU of both ends of every veth pair; the kernel's default (1500) if
	// 0. It should not exceed the MTU of the host's uplink.
	MTU int
	// Deny are destinations no sandbox reaches, beside DefaultDeny (the
	// private, shared and link-local ranges, where a fleet's hosts, its
	// control plane and clouds' metadata services are). Allow are
	// destinations sandboxes with internet access reach even when denied
	// (an operator's internal service). The resolvers sandboxes are given
	// (ResolvConf) are reached on port 53 whatever the lists say.
	Deny, Allow []netip.Prefix
	// ResolvConf, if set, is the resolv.conf whose IPv4 nameservers the
	// sandboxes use (ResolvConf, Resolvers); else the host's
	// /etc/resolv.conf, or systemd-resolved's upstream list.
	ResolvConf string
	// EgressProxyPort and DNSFilterPort are where sandboxd's egress proxy
	// and DNS filter listen on the host (package egressproxy), which the
	// rules of sandboxes that allow domain names or deny all redirect to
	// (see SetPolicy); 0: such rules are refused, and nothing redirects.
	EgressProxyPort, DNSFilterPort uint16
}

// DefaultDeny are the destinations no sandbox reaches unless allowed:
// "this network", RFC 1918's private ranges, RFC 6598's shared range
// (CGNAT; Alibaba Cloud's metadata service at 100.100.100.200), loopback,
// link-local (the metadata services of AWS, GCP, Azure and others at
// 169.254.169.254, ECS's at 169.254.170.2), the IETF's protocol range
// (Oracle Cloud's 192.0.0.192), Azure's host agent (168.63.129.16),
// multicast and the reserved range. In a fleet, the private ranges hold
// every other host's sandboxd and the control plane.
var DefaultDeny = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Manager sets up and tears down sandboxes' network namespaces. It is safe
// for concurrent use.
type Manager struct {
	nsDir  string
	prefix string
	pool   netip.Prefix
	mtu    int
	table  *nftables.Table
	deny   []netip.Prefix
	allow  []netip.Prefix
	// proxyPort and dnsPort are Options.EgressProxyPort and DNSFilterPort.
	proxyPort, dnsPort uint16
	// resolvConf are the files ResolvConf reads, in order.
	resolvConf []string

	// nftMu serializes nftables batches on nft, a lasting connection
	// (dialling one per batch costs more than the batch).
	nftMu sync.Mutex
	nft   *nftables.Conn
}

// Sandbox is the network of one sandbox.
type Sandbox struct {
	ID string
	// NetNS is the path of the namespace's bind mount, for the runtime to
	// join.
	NetNS string
	// HostIface is the host end of the veth pair.
	HostIface string
	Block     ipam.Block
}

// New checks opts and returns a Manager. It changes nothing on the host;
// Init does.
func New(opts Options) (*Manager, error) {
	if opts.RunDir == "" {
		return nil, errors.New("network: RunDir is required")
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.IfacePrefix == "" {
		opts.IfacePrefix = DefaultIfacePrefix
	}
	if len(opts.IfacePrefix) > maxPrefixLen || !validName(opts.IfacePrefix) {
		return nil, fmt.Errorf("network: interface prefix %q is not 1 to %d of [a-z0-9_-]", opts.IfacePrefix, maxPrefixLen)
	}
	if !opts.Pool.IsValid() || !opts.Pool.Addr().Is4() || opts.Pool.Bits() < 8 || opts.Pool.Bits() > 30 {
		return nil, fmt.Errorf("network: sandbox pool %v is not an IPv4 prefix between /8 and /30", opts.Pool)
	}
	if opts.MTU < 0 {
		return nil, fmt.Errorf("network: MTU %d is negative", opts.MTU)
	}
	for _, p := range slices.Concat(opts.Deny, opts.Allow) {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, fmt.Errorf("network: %v is not an IPv4 prefix (sandboxes have IPv4 only)", p)
		}
	}
	m := &Manager{
		nsDir:      filepath.Join(opts.RunDir, "netns"),
		prefix:     opts.IfacePrefix,
		pool:       opts.Pool.Masked(),
		mtu:        opts.MTU,
		table:      &nftables.Table{Name: opts.Table, Family: nftables.TableFamilyINet},
		allow:      masked(opts.Allow),
		proxyPort:  opts.EgressProxyPort,
		dnsPort:    opts.DNSFilterPort,
		resolvConf: []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"},
	}
	if opts.ResolvConf != "" {
		m.resolvConf = []string{opts.ResolvConf}
	}
	m.deny = masked(slices.Concat(DefaultDeny, opts.Deny))
	return m, nil
}

func masked(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if p = p.Masked(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// Init prepares the host: it creates RunDir/netns as a shared mount point
// (as `ip netns` does, so that unmounting a namespace also unmounts the
// copies other mount namespaces took of it), enables IPv4 forwarding, and
// replaces the nftables table with the current rules in one transaction.
// The egress set survives the replacement, so running sandboxes keep their
// internet access across a restart of sandboxd; so do the other sets of
// keptSets. A sandbox's own rules (SetPolicy) do not: until they are set
// again, what it sends beyond its resolvers is refused. It makes or finds
// the router namespace (router.go); when that was gone while sandboxes
// had namespaces, it does all the rest and returns ErrNetworksLost, naming
// them.
func (m *Manager) Init(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.MkdirAll(m.nsDir, 0o755); err != nil {
		return fmt.Errorf("create namespace directory: %w", err)
	}
	if err := makeShared(m.nsDir); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", m.nsDir, err)
	}
	if err := enableForwarding(); err != nil {
		return err
	}
	lost, err := m.initRouter()
	if err != nil {
		return err
	}
	err = m.nftBatch(func(cc *nftables.Conn) error {
		kept := make(map[string][]nftables.SetElement)
		for _, set := range m.keptSets() {
			elems, err := m.keptMembers(cc, set.Name)
			if err != nil {
				return fmt.Errorf("read set %s: %w", set.Name, err)
			}
			kept[set.Name] = elems
		}
		return m.writeRules(cc, kept)
	})
	if err != nil {
		return fmt.Errorf("install nftables table %s: %w", m.table.Name, err)
	}
	// What the host's TCP remembers of the pool's addresses (tcpmetrics.go),
	// left by sandboxes that ended before: a cache, so that of the live
	// ones goes too, harmlessly.
	peers, err := tcpMetricsPeers()
	if err != nil {
		return err
	}
	for _, a := range peers {
		if m.pool.Contains(a) {
			if err := forgetTCPMetrics(a); err != nil {
				return err
			}
		}
	}
	if len(lost) > 0 {
		return fmt.Errorf("%w: %s", ErrNetworksLost, strings.Join(lost, ", "))
	}
	return nil
}

// Remove undoes Init but for IPv4 forwarding: it deletes the nftables table
// and, if no sandbox namespace is left, unmounts RunDir/netns. It is for
// tests and uninstalling.
func (m *Manager) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := m.nftBatch(func(cc *nftables.Conn) error {
		cc.AddTable(m.table) // adding first makes the deletion succeed when the table is gone
		cc.DelTable(m.table)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete nftables table %s: %w", m.table.Name, err)
	}
	ids, err := m.List()
	if err != nil || len(ids) > 0 {
		return err
	}
	if err := m.removeRouter(); err != nil {
		return err
	}
	if err := unix.Unmount(m.nsDir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", m.nsDir, err)
	}
	return nil
}

// Close releases the Manager's nftables connection. It changes nothing on
// the host, and a Manager used after Close opens a new connection.
func (m *Manager) Close() error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if m.nft == nil {
		return nil
	}
	err := m.nft.CloseLasting()
	m.nft = nil
	return err
}

// Setup creates sandbox id's network namespace and veth pair with the
// addresses of block b and its default route, and gives it internet access
// if allowInternet. Init
// must have run, in this process or an earlier one. Setup fails, changing
// nothing, if the sandbox already has a namespace; on any other error it
// undoes what it did.
func (m *Manager) Setup(ctx context.Context, id string, b ipam.Block, allowInternet bool) (_ *Sandbox, err error) {
	if err := m.check(id, b); err != nil {
		return nil, fmt.Errorf("set up network of sandbox %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sb := &Sandbox{ID: id, NetNS: m.nsPath(id), HostIface: m.hostIface(id), Block: b}
	f, err := os.OpenFile(sb.NetNS, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create network namespace file for sandbox %s: %w", id, err)
	}
	_ = f.Close()
	linked := false
	defer func() {
		if err == nil {
			return
		}
		if linked {
			err = errors.Join(err, m.deleteSandboxLink(sb.HostIface))
		}
		err = errors.Join(err, removeNS(sb.NetNS))
	}()

	// A netlink socket stays in the namespace it was opened in: this one,
	// opened in the router namespace, configures the host end from the
	// sandbox's thread.
	router, routerNS, err := m.routerHandle()
	if err != nil {
		return nil, fmt.Errorf("open netlink for sandbox %s: %w", id, err)
	}
	defer router.Close()
	defer routerNS.Close()
	if err := m.deleteStale(router, b); err != nil {
		return nil, fmt.Errorf("set up network of sandbox %s: %w", id, err)
	}
	err = onNSThread(
		func() error { return unix.Unshare(unix.CLONE_NEWNET) },
		func(netns.NsHandle) error { return m.configure(sb, routerNS, router, &linked) },
	)
	if err != nil {
		return nil, fmt.Errorf("set up network of sandbox %s: %w", id, err)
	}
	// Removing the address as well when internet access is off overwrites
	// what a stale entry may say.
	if err := m.setEgress(b.Sandbox, allowInternet); err != nil {
		return nil, fmt.Errorf("set egress of sandbox %s: %w", id, err)
	}
	return sb, nil
}

// configure runs on a thread in the sandbox's new namespace. It pins the
// namespace to its file, sets its sysctls, brings up lo, creates the veth
// pair with its host end in the router namespace routerNS (router.go), and
// addresses and brings up both ends, the host end through router, a
// netlink handle in routerNS.
func (m *Manager) configure(sb *Sandbox, routerNS netns.NsHandle, router *netlink.Handle, linked *bool) error {
	if err := unix.Mount("/proc/thread-self/ns/net", sb.NetNS, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount namespace: %w", err)
	}
	in, err := setUpNamespace([]sysctl{
		{"net/ipv4/ip_unprivileged_port_start", "0"},
		{"net/ipv4/ping_group_range", "0 2147483647"},
		// eth0 is created after this and gets no IPv6: sandboxes have
		// IPv4 only, and lo keeps its ::1.
		{"net/ipv6/conf/default/disable_ipv6", "1"},
	})
	if err != nil {
		return err
	}
	defer in.Close()

	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.Flags = sandboxIface, m.mtu, net.FlagUp
	// A veth pair has as many queues as the host has CPUs unless told
	// otherwise; without XDP they serve no purpose but cost time and memory.
	attrs.NumTxQueues, attrs.NumRxQueues = 1, 1
	eth0 := netlink.NewVeth(attrs)
	eth0.PeerName, eth0.PeerNamespace = sb.HostIface, netlink.NsFd(routerNS)
	eth0.PeerNumTxQueues, eth0.PeerNumRxQueues = 1, 1
	if err := in.LinkAdd(eth0); err != nil {
		return fmt.Errorf("create veth pair %s: %w", sb.HostIface, err)
	}
	*linked = true
	if err := in.AddrAdd(eth0, addr(sb.Block.Sandbox)); err != nil {
		return fmt.Errorf("address %s: %w", sandboxIface, err)
	}
	if err := in.RouteAdd(defaultRoute(eth0.Index, sb.Block.Host)); err != nil {
		return fmt.Errorf("add default route: %w", err)
	}

	hostEnd, err := router.LinkByName(sb.HostIface)
	if err != nil {
		return fmt.Errorf("find host interface %s: %w", sb.HostIface, err)
	}
	// No IPv6 on the host end either (it would get a link-local address
	// when it comes up): sandboxes have IPv4 only. (In the host's
	// namespace, each IPv6 address of an interface cost a walk of the
	// whole conntrack table when the interface went: masquerade's address
	// notifier runs for every removed IPv6 address.)
	if err := router.LinkSetIP6AddrGenMode(hostEnd, addrGenModeNone); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("turn off IPv6 addresses of host interface %s: %w", sb.HostIface, err)
	}
	if err := router.AddrAdd(hostEnd, addr(sb.Block.Host)); err != nil {
		return fmt.Errorf("address host interface %s: %w", sb.HostIface, err)
	}
	if err := router.LinkSetUp(hostEnd); err != nil {
		return fmt.Errorf("bring up host interface %s: %w", sb.HostIface, err)
	}
	// eth0 came up before its peer, without a carrier, so it transmits
	// only once the kernel's link watch has seen the carrier. Asking for
	// its state has the kernel do that now instead of some time later, so
	// that the first packets of the sandbox are not dropped.
	if _, err := in.LinkByIndex(eth0.Index); err != nil {
		return fmt.Errorf("sync %s: %w", sandboxIface, err)
	}
	return nil
}

// Teardown removes sandbox id's network: its address from the egress set,
// its rules (SetPolicy), and its namespace's bind mount and file. The
// namespace itself goes when the last process in it exits, and its veth
// pair with it: the kernel destroys the namespaces that end in batches,
// each batch's interfaces under one hold of its global network lock
// (RTNL) and one wait for RCU, where deleting the pair here held that lock
// through a wait of its own for every sandbox, and made the other
// sandboxes' setups and teardowns queue behind it (contention on RTNL was
// the largest lock wait at c = 20). A pair whose namespace file was
// already gone (a teardown cut short) is deleted here. A pair left by a
// namespace something still holds is deleted by the Setup of its block.
// Teardown of a sandbox with nothing left succeeds.
//
// If b is the zero Block (an orphan whose block sandboxd no longer knows),
// the address is found as eth0's in the sandbox's namespace: left in the
// ruled, proxied or DNS-filtered set (a new Init empties the verdict map
// but keeps the sets), it would refuse or filter the traffic of the next
// sandbox at that address. When the namespace is gone, the next Setup of
// the address overwrites its egress entry only.
func (m *Manager) Teardown(ctx context.Context, id string, b ipam.Block) error {
	if !validID(id) {
		return fmt.Errorf("tear down network of sandbox %q: invalid ID", id)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var errs []error
	a := b.Sandbox
	if !a.Is4() {
		var err error
		if a, err = m.orphanAddr(id); err != nil {
			errs = append(errs, fmt.Errorf("find the address of sandbox %s: %w", id, err))
		}
	}
	if a.Is4() {
		if err := m.setEgress(a, false); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove egress of sandbox %s: %w", id, err))
		}
		if err := m.clearRules(id, a); err != nil {
			errs = append(errs, fmt.Errorf("remove rules of sandbox %s: %w", id, err))
		}
	}
	if !isNSMount(m.nsPath(id)) {
		if err := m.deleteSandboxLink(m.hostIface(id)); err != nil {
			errs = append(errs, fmt.Errorf("delete veth pair of sandbox %s: %w", id, err))
		}
	}
	if err := removeNS(m.nsPath(id)); err != nil {
		errs = append(errs, fmt.Errorf("remove network namespace of sandbox %s: %w", id, err))
	}
	if a.Is4() {
		// Best effort: a cache entry left behind costs time, not
		// correctness, and Init forgets those of the pool.
		_ = forgetTCPMetrics(a)
	}
	return errors.Join(errs...)
}

// orphanAddr is the address of sandbox id, whose block is not known (see
// Teardown): eth0's in its namespace, or the zero Addr when the namespace
// or its eth0 is gone.
func (m *Manager) orphanAddr(id string) (netip.Addr, error) {
	var a netip.Addr
	if !isNSMount(m.nsPath(id)) {
		return a, nil
	}
	err := onNSThread(enterPath(m.nsPath(id)), func(netns.NsHandle) error {
		eth0, err := netlink.LinkByName(sandboxIface)
		if _, gone := errors.AsType[netlink.LinkNotFoundError](err); gone {
			return nil // gone with the router namespace (ErrNetworksLost)
		}
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, ad := range addrs {
			if x, ok := netip.AddrFromSlice(ad.IP.To4()); ok && m.pool.Contains(x) {
				a = x
			}
		}
		return nil
	})
	return a, err
}

// SetEgress turns sandbox id's internet access on or off: its entry in the
// egress set. New connections follow at once; connections already open go
// on (as when its rules change, SetPolicy).
func (m *Manager) SetEgress(id string, b ipam.Block, allow bool) error {
	if err := m.check(id, b); err != nil {
		return fmt.Errorf("set egress of sandbox %s: %w", id, err)
	}
	if err := m.setEgress(b.Sandbox, allow); err != nil {
		return fmt.Errorf("set egress of sandbox %s: %w", id, err)
	}
	return nil
}

// List returns the IDs of the sandboxes with a namespace file, sorted; after
// a crash, those without a sandbox are for Teardown.
func (m *Manager) List() ([]string, error) {
	entries, err := os.ReadDir(m.nsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if validID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// ResolvConf returns a resolv.conf for sandboxes: the host's IPv4
// nameservers outside loopback and the pool, from /etc/resolv.conf or, when
// that has none (a local stub resolver such as systemd-resolved's
// 127.0.0.53, which a sandbox cannot reach), from systemd-resolved's list of
// upstream servers. Search domains and options are not copied. A nameserver
// at another of the host's own addresses is kept but unreachable too: the
// input rules drop whatever sandboxes send to the host.
func (m *Manager) ResolvConf() []byte {
	var out bytes.Buffer
	for _, a := range m.Resolvers() {
		fmt.Fprintf(&out, "nameserver %s\n", a)
	}
	if out.Len() == 0 {
		return []byte("# the host has no nameserver that sandboxes can reach\n")
	}
	return out.Bytes()
}

// Resolvers are the nameservers of ResolvConf: the host's IPv4
// nameservers outside loopback and the pool. The rules let sandboxes reach
// them on port 53 even in a denied range (a VPC's resolver at 10.0.0.2,
// AWS's at 169.254.169.253).
func (m *Manager) Resolvers() []netip.Addr {
	for _, p := range m.resolvConf {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var out []netip.Addr
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "nameserver" {
				continue
			}
			a, err := netip.ParseAddr(f[1])
			if err == nil && a.Is4() && !a.IsLoopback() && !a.IsUnspecified() && !m.pool.Contains(a) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

func (m *Manager) nsPath(id string) string { return filepath.Join(m.nsDir, id) }

// NSPath is the path of sandbox id's namespace (Sandbox.NetNS), which
// Setup made or will make: the relay dials a sandbox's loopback through it
// (DialLoopback).
func (m *Manager) NSPath(id string) string { return m.nsPath(id) }

// hostIface is the name of the host end of sandbox id's veth pair: the
// prefix and as much of the hex SHA-256 of the ID as fits.
func (m *Manager) hostIface(id string) string {
	sum := sha256.Sum256([]byte(id))
	return m.prefix + hex.EncodeToString(sum[:])[:maxIfaceLen-len(m.prefix)]
}

func (m *Manager) check(id string, b ipam.Block) error {
	if !validID(id) {
		return errors.New("invalid ID")
	}
	if b.Prefix.Bits() != 30 || !b.Host.Is4() || !b.Sandbox.Is4() || b.Host == b.Sandbox ||
		!b.Prefix.Contains(b.Host) || !b.Prefix.Contains(b.Sandbox) || !m.pool.Contains(b.Sandbox) {
		return fmt.Errorf("block %+v is not a /30 of the pool %s", b, m.pool)
	}
	return nil
}

// validID reports whether id can name a namespace file: 1 to 64 of
// [a-zA-Z0-9_-] (sandbox IDs are 20 of [a-z0-9]).
func validID(id string) bool {
	if len(id) == 0 || len(id) > maxIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validName reports whether s is a non-empty string of [a-z0-9_-].
func validName(s string) bool {
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return s != ""
}

// addr is a's /30 as netlink wants it.
func addr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}}
}

func defaultRoute(linkIndex int, gw netip.Addr) *netlink.Route {
	return &netlink.Route{
		LinkIndex: linkIndex, Gw: gw.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
	}
}

// deleteSandboxLink deletes a sandbox's host interface, and with it its
// veth peer: in the router namespace, or in the host's, where a sandboxd
// before the router namespace put them.
func (m *Manager) deleteSandboxLink(name string) error {
	router, routerNS, err := m.routerHandle()
	if err != nil {
		if isNSMount(m.routerPath()) {
			return err
		}
		return deleteLink(&netlink.Handle{}, name) // no router: not yet, or removed
	}
	defer router.Close()
	defer routerNS.Close()
	if err := deleteLink(router, name); err != nil {
		return err
	}
	return deleteLink(&netlink.Handle{}, name)
}

// deleteLink deletes the interface name through h (the zero Handle: in this
// thread's namespace), and with it its veth peer; an interface that is not
// there is not an error.
func deleteLink(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if _, ok := errors.AsType[netlink.LinkNotFoundError](err); ok {
		return nil
	}
	if err != nil {
		return err
	}
	if err := h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return err
	}
	return nil
}
