package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/shared/testing/forwardtest"
)

// blocked is how long a connection that the rules drop is given.
const blocked = 300 * time.Millisecond

// env is one test's Manager with its own table, interface prefix and pool,
// all removed when the test ends.
type env struct {
	tb   testing.TB
	opts Options
	m    *Manager
	ipam *ipam.Pool
	tag  string // random letters that make names unique to the test
	// outsides counts the outside namespaces made, whose addresses are in
	// 198.18.<outsideBase+outsides>.0/24.
	outsides, outsideBase int
}

func newEnv(tb testing.TB, edit ...func(*Options, *Manager)) *env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces, veth pairs and nftables tables")
	}
	tag := randLetters(3)
	pool := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + rand.IntN(50)), byte(rand.IntN(256)), 0}), 24)
	e := &env{
		tb: tb, tag: tag,
		opts: Options{RunDir: tb.TempDir(), Table: "skiff-test-" + tag, IfacePrefix: "nt" + tag, Pool: pool},
	}
	var err error
	if e.ipam, err = ipam.New(pool.String()); err != nil {
		tb.Fatal(err)
	}
	for _, ed := range edit {
		ed(&e.opts, nil)
	}
	if e.m, err = New(e.opts); err != nil {
		tb.Fatal(err)
	}
	for _, ed := range edit {
		ed(&e.opts, e.m)
	}
	forwardtest.Keep(tb)
	// Runs after the cleanups of the test's sandboxes: removes the table
	// and anything the test leaked, and fails the test if it leaked.
	tb.Cleanup(e.sweep)
	if err := e.m.Init(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return e
}

// sweep removes what is left of the environment and reports leaks.
func (e *env) sweep() {
	if ids, _ := e.m.List(); len(ids) > 0 {
		e.tb.Errorf("leaked network namespaces: %v", ids)
		for _, id := range ids {
			_ = removeNS(e.m.nsPath(id))
		}
	}
	// Sandboxes' interfaces left in the router namespace or the host's;
	// the host's end of the link to the router goes with Remove.
	if router, ns, err := e.m.routerHandle(); err == nil {
		// A torn-down sandbox's pair goes with its namespace, which the
		// kernel destroys in the background once nothing holds it.
		waitNoLinks(e.tb, router, e.opts.IfacePrefix, 10*time.Second)
		e.sweepLinks(router, "")
		router.Close()
		ns.Close()
	}
	e.sweepLinks(&netlink.Handle{}, e.m.hostLink())
	if err := errors.Join(e.m.Remove(context.Background()), e.m.Close()); err != nil {
		e.tb.Error(err)
	}
	if _, err := netlink.LinkByName(e.m.hostLink()); err == nil {
		e.tb.Errorf("the router's link %s is still there", e.m.hostLink())
	}
	if _, err := os.Stat(e.m.routerPath()); err == nil {
		e.tb.Errorf("the router namespace %s is still there", e.m.routerPath())
	}
	if tableExists(e.tb, e.opts.Table) {
		e.tb.Errorf("nftables table %s is still there", e.opts.Table)
	}
}

// router is a netlink handle in the router namespace, closed when the test
// ends: where the host ends of the sandboxes' veth pairs are.
func (e *env) router() *netlink.Handle {
	e.tb.Helper()
	h, ns, err := e.m.routerHandle()
	if err != nil {
		e.tb.Fatal(err)
	}
	e.tb.Cleanup(func() {
		h.Close()
		ns.Close()
	})
	return h
}

// waitNoLinks waits, at most within, until h lists no interface starting
// with prefix (a whole name of 15 characters is one interface), and
// reports whether none is left.
func waitNoLinks(tb testing.TB, h *netlink.Handle, prefix string, within time.Duration) bool {
	tb.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		links, err := h.LinkList()
		if err != nil {
			tb.Error(err)
			return false
		}
		if !slices.ContainsFunc(links, func(l netlink.Link) bool { return strings.HasPrefix(l.Attrs().Name, prefix) }) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// sweepLinks reports and deletes the interfaces of the sandboxes' prefix
// that h lists, but keep.
func (e *env) sweepLinks(h *netlink.Handle, keep string) {
	links, err := h.LinkList()
	if err != nil {
		e.tb.Error(err)
	}
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, e.opts.IfacePrefix) && name != keep {
			e.tb.Errorf("leaked interface %s", name)
			_ = h.LinkDel(l)
		}
	}
}

// setup sets up a sandbox and tears it down when the test ends.
func (e *env) setup(name string, allowInternet bool) *Sandbox {
	e.tb.Helper()
	id := name + e.tag
	b, err := e.ipam.Allocate(id)
	if err != nil {
		e.tb.Fatal(err)
	}
	sb, err := e.m.Setup(context.Background(), id, b, allowInternet)
	if err != nil {
		e.tb.Fatal(err)
	}
	e.tb.Cleanup(func() {
		if err := e.m.Teardown(context.Background(), id, b); err != nil {
			e.tb.Error(err)
		}
	})
	return sb
}

// outside is a network namespace standing in for the internet: linked to
// the host by a veth pair in 198.18.0.0/15 (the benchmarking range), with a
// route back to the sandbox pool through the host.
type outside struct {
	ns         string
	host, addr netip.Addr
	held       map[netip.Addr]bool // addresses hold gave it
}

func (e *env) outside() *outside {
	e.tb.Helper()
	if e.outsides == 0 {
		e.outsideBase = rand.IntN(256)
	}
	e.outsides++
	n := byte(e.outsideBase + e.outsides) // apart from the env's other outsides
	o := &outside{
		ns:   filepath.Join(e.opts.RunDir, fmt.Sprintf("outside%d", e.outsides)),
		host: netip.AddrFrom4([4]byte{198, 18, n, 1}), addr: netip.AddrFrom4([4]byte{198, 18, n, 2}),
	}
	hostIface := fmt.Sprintf("nx%s%d", e.tag, e.outsides) // not of the sandboxes' prefix
	e.tb.Cleanup(func() {
		if err := errors.Join(deleteLink(&netlink.Handle{}, hostIface), removeNS(o.ns)); err != nil {
			e.tb.Error(err)
		}
	})
	if err := os.WriteFile(o.ns, nil, 0o444); err != nil {
		e.tb.Fatal(err)
	}
	err := onNSThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func(host netns.NsHandle) error {
		if err := unix.Mount("/proc/thread-self/ns/net", o.ns, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		veth := netlink.NewVeth(netlink.LinkAttrs{Name: "eth0", TxQLen: -1})
		veth.PeerName, veth.PeerNamespace = hostIface, netlink.NsFd(host)
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return errors.Join(
			netlink.LinkSetUp(lo), netlink.AddrAdd(veth, addr(o.addr)), netlink.LinkSetUp(veth),
			netlink.RouteAdd(&netlink.Route{LinkIndex: veth.Index, Gw: o.host.AsSlice(), Dst: prefixNet(e.opts.Pool)}),
		)
	})
	if err != nil {
		e.tb.Fatal(err)
	}
	link, err := netlink.LinkByName(hostIface)
	if err != nil {
		e.tb.Fatal(err)
	}
	if err := errors.Join(netlink.AddrAdd(link, addr(o.host)), netlink.LinkSetUp(link)); err != nil {
		e.tb.Fatal(err)
	}
	// Have the kernel's link watch see the carrier of eth0 now (see
	// Manager.configure).
	err = onNSThread(enterPath(o.ns), func(netns.NsHandle) error {
		_, err := netlink.LinkByName("eth0")
		return err
	})
	if err != nil {
		e.tb.Fatal(err)
	}
	return o
}

// TestSandboxSide checks a sandbox's side of the network: its address,
// routes, loopback and sysctls.
func TestSandboxSide(t *testing.T) {
	e := newEnv(t)
	on, off := e.setup("on", true), e.setup("off", false)
	router := e.router()
	for _, sb := range []*Sandbox{on, off} {
		if want := filepath.Join(e.opts.RunDir, "netns", sb.ID); sb.NetNS != want {
			t.Errorf("NetNS = %s, want %s", sb.NetNS, want)
		}
		if len(sb.HostIface) > 15 || !strings.HasPrefix(sb.HostIface, e.opts.IfacePrefix) {
			t.Errorf("HostIface = %q", sb.HostIface)
		}
		// The host end is in the router namespace, not the host's, and
		// has its block's host address and nothing else.
		if _, err := netlink.LinkByName(sb.HostIface); err == nil {
			t.Errorf("%s is in the host's namespace", sb.HostIface)
		}
		if hostEnd, err := router.LinkByName(sb.HostIface); err != nil {
			t.Errorf("%s: %v", sb.HostIface, err)
		} else if addrs, err := router.AddrList(hostEnd, netlink.FAMILY_ALL); err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != sb.Block.Host.String()+"/30" {
			t.Errorf("%s: addresses = %v, %v; want only %s/30", sb.HostIface, addrs, err, sb.Block.Host)
		}
		inNS(t, sb.NetNS, func() error {
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(eth0, netlink.FAMILY_ALL)
			if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != sb.Block.Sandbox.String()+"/30" {
				t.Errorf("%s: eth0 addresses = %v, %v; want only %s/30", sb.ID, addrs, err, sb.Block.Sandbox)
			}
			routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			hasDefault := slices.ContainsFunc(routes, func(r netlink.Route) bool {
				return (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw.Equal(sb.Block.Host.AsSlice())
			})
			if !hasDefault {
				t.Errorf("%s: no default route via %s (routes %v)", sb.ID, sb.Block.Host, routes)
			}
			for name, want := range map[string]string{
				"net/ipv4/ip_unprivileged_port_start": "0",
				"net/ipv4/ping_group_range":           "0\t2147483647",
			} {
				if got, err := os.ReadFile("/proc/sys/" + name); err != nil || strings.TrimSpace(string(got)) != want {
					t.Errorf("%s: %s = %q, %v; want %q", sb.ID, name, got, err, want)
				}
			}
			l, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				return err
			}
			defer l.Close()
			c, err := net.DialTimeout("tcp4", l.Addr().String(), time.Second)
			if err != nil {
				return fmt.Errorf("%s: lo: %w", sb.ID, err)
			}
			return c.Close()
		})
	}
}

// TestHostReachesSandbox: sandboxd connects to a sandbox's ports, with and
// without internet access.
func TestHostReachesSandbox(t *testing.T) {
	e := newEnv(t)
	for _, sb := range []*Sandbox{e.setup("on", true), e.setup("off", false)} {
		l := listenIn(t, sb.NetNS, sb.Block.Sandbox)
		c, err := net.DialTimeout("tcp4", l.Addr().String(), time.Second)
		if err != nil {
			t.Fatalf("host to sandbox %s: %v", sb.ID, err)
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		peer, ok := accept(l, time.Second)
		c.Close()
		if !ok || peer.Addr() != hostLinkAddr {
			t.Fatalf("sandbox %s saw %v, %v; want a connection from the host's end of the router's link, %s", sb.ID, peer, ok, hostLinkAddr)
		}
	}
	// An address of the pool that no sandbox has is unreachable at once
	// (the router's route), not a timeout.
	free, err := e.ipam.Allocate("free" + e.tag)
	if err != nil {
		t.Fatal(err)
	}
	defer e.ipam.Release("free" + e.tag)
	if _, err := net.DialTimeout("tcp4", netip.AddrPortFrom(free.Sandbox, 49983).String(), 5*time.Second); !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("dial of a free address of the pool = %v, want EHOSTUNREACH", err)
	}
}

// TestFirstConnection: sandboxd's first connection to a sandbox right after
// Setup gets through at once: no packet is dropped while the kernel has not
// yet seen the carrier of the veth pair.
func TestFirstConnection(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := range 10 {
		id := fmt.Sprintf("first%d%s", i, e.tag)
		b, err := e.ipam.Allocate(id)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := e.m.Setup(ctx, id, b, true)
		if err != nil {
			t.Fatal(err)
		}
		l := listenIn(t, sb.NetNS, sb.Block.Sandbox)
		c, dialErr := net.DialTimeout("tcp4", l.Addr().String(), blocked)
		if dialErr == nil {
			c.Close()
		}
		l.Close()
		if err := e.m.Teardown(ctx, id, b); err != nil {
			t.Fatal(err)
		}
		e.ipam.Release(id)
		if dialErr != nil {
			t.Fatalf("connection %d right after Setup: %v", i, dialErr)
		}
	}
}

// TestSandboxesIsolated: a sandbox cannot reach another sandbox, even with
// internet access (a default route) on both.
func TestSandboxesIsolated(t *testing.T) {
	e := newEnv(t)
	a, b := e.setup("a", true), e.setup("b", true)
	for _, pair := range [][2]*Sandbox{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		l := listenIn(t, to.NetNS, to.Block.Sandbox)
		if c, err := dialIn(from.NetNS, l.Addr().String()); err == nil {
			c.Close()
			t.Errorf("sandbox %s connected to sandbox %s", from.ID, to.ID)
		}
		if peer, ok := accept(l, 50*time.Millisecond); ok {
			t.Errorf("sandbox %s's listener accepted %v", to.ID, peer)
		}
	}
}

// TestRouterTracksNoConnections: the sandboxes' traffic, to the outside
// and from the host, leaves no conntrack entry in the router namespace,
// where the sandboxes' interfaces come and go: the kernel then skips its
// walk of the conntrack table when one goes (router.go).
func TestRouterTracksNoConnections(t *testing.T) {
	e := newEnv(t)
	sb := e.setup("on", true)
	out := e.outside()
	l := listenIn(t, out.ns, out.addr)
	c, err := dialIn(sb.NetNS, l.Addr().String())
	if err != nil {
		t.Fatalf("sandbox to the outside: %v", err)
	}
	defer c.Close()
	if _, ok := accept(l, time.Second); !ok {
		t.Fatal("the outside saw no connection")
	}
	in := listenIn(t, sb.NetNS, sb.Block.Sandbox)
	hc, err := net.DialTimeout("tcp4", in.Addr().String(), time.Second)
	if err != nil {
		t.Fatalf("host to sandbox: %v", err)
	}
	defer hc.Close()
	count := func(path string) string {
		var n []byte
		err := onNSThread(enterPath(path), func(netns.NsHandle) error {
			var err error
			n, err = os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(n))
	}
	if n := count(e.m.routerPath()); n != "0" {
		t.Errorf("the router namespace tracks %s connections, want 0", n)
	}
	// The host does track them: the count is not 0 for want of traffic.
	if n := count("/proc/self/ns/net"); n == "0" {
		t.Error("the host tracks no connection either: the test's traffic did not pass")
	}
}

// TestHostClosedToSandboxes: a sandbox cannot connect to a port the host
// listens on (standing in for sandboxd's admin port) at any of the host's
// addresses, that of its end of the router's link included.
func TestHostClosedToSandboxes(t *testing.T) {
	e := newEnv(t)
	a := e.setup("a", true)
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4zero})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).AddrPort().Port()
	targets := []netip.Addr{hostLinkAddr}
	if other, ok := hostAddr(t, e.opts.Pool); ok {
		targets = append(targets, other)
	}
	for _, to := range targets {
		dst := netip.AddrPortFrom(to, port).String()
		if c, err := dialIn(a.NetNS, dst); err == nil {
			c.Close()
			t.Errorf("sandbox connected to the host at %s", dst)
		}
		if peer, ok := accept(l, 50*time.Millisecond); ok {
			t.Errorf("host listener accepted %v (dialled %s)", peer, dst)
		}
		// The host itself still can.
		c, err := net.DialTimeout("tcp4", dst, time.Second)
		if err != nil {
			t.Fatalf("host to itself at %s: %v", dst, err)
		}
		c.Close()
		if _, ok := accept(l, time.Second); !ok {
			t.Fatalf("host listener missed the host's own connection to %s", dst)
		}
	}
}

// TestEgress: a sandbox with internet access reaches the outside,
// masqueraded; one without is refused at once (ENETUNREACH), also when it
// spoofs another sandbox's address. SetEgress turns access on and off for
// new connections, and an open one goes on. Nothing outside reaches a
// sandbox.
func TestEgress(t *testing.T) {
	e := newEnv(t)
	on, off := e.setup("on", true), e.setup("off", false)
	out := e.outside()
	l := listenIn(t, out.ns, out.addr)
	dst := l.Addr().String()

	reaches := func(sb *Sandbox) error {
		t.Helper()
		c, err := dialIn(sb.NetNS, dst)
		if err != nil {
			if peer, ok := accept(l, 50*time.Millisecond); ok {
				t.Fatalf("dial from %s failed but the outside accepted %v", sb.ID, peer)
			}
			return err
		}
		c.Close()
		peer, ok := accept(l, time.Second)
		if !ok || peer.Addr() != out.host {
			t.Fatalf("the outside saw %v, %v from sandbox %s; want the host's address %s", peer, ok, sb.ID, out.host)
		}
		return nil
	}
	if err := reaches(on); err != nil {
		t.Fatalf("sandbox with internet access: %v", err)
	}
	if err := reaches(off); !errors.Is(err, syscall.ENETUNREACH) {
		t.Fatalf("sandbox without internet access: %v, want ENETUNREACH", err)
	}

	// Spoofing the address of a sandbox with access does not get it out.
	u := listenUDPIn(t, out.ns, out.addr)
	sendUDP := func(sb *Sandbox, from netip.Addr) bool {
		t.Helper()
		err := onNSThread(enterPath(sb.NetNS), func(netns.NsHandle) error {
			lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TRANSPARENT, 1) })
				return errors.Join(err, serr)
			}}
			pc, err := lc.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(from, 0).String())
			if err != nil {
				return err
			}
			defer pc.Close()
			_, err = pc.WriteTo([]byte("x"), u.LocalAddr())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = u.SetReadDeadline(time.Now().Add(blocked))
		_, _, err = u.ReadFrom(make([]byte, 16))
		return err == nil
	}
	if !sendUDP(on, on.Block.Sandbox) {
		t.Fatal("UDP from the sandbox with internet access did not arrive")
	}
	if sendUDP(off, on.Block.Sandbox) {
		t.Fatal("UDP from the sandbox without access, spoofing the other's address, got out")
	}

	// SetEgress.
	if err := e.m.SetEgress(off.ID, off.Block, true); err != nil {
		t.Fatal(err)
	}
	if err := reaches(off); err != nil {
		t.Fatalf("after SetEgress(true): %v", err)
	}
	open, err := dialIn(off.NetNS, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	far, ok := acceptConn(l, time.Second)
	if !ok {
		t.Fatal("the outside missed the connection opened before SetEgress(false)")
	}
	defer far.Close()
	if err := e.m.SetEgress(off.ID, off.Block, false); err != nil {
		t.Fatal(err)
	}
	if err := reaches(off); !errors.Is(err, syscall.ENETUNREACH) {
		t.Fatalf("after SetEgress(false): %v, want ENETUNREACH", err)
	}
	if _, err := open.Write([]byte("still open")); err != nil {
		t.Fatalf("connection opened before SetEgress(false): %v", err)
	}
	_ = far.SetReadDeadline(time.Now().Add(time.Second))
	if got, err := io.ReadAll(io.LimitReader(far, 10)); err != nil || string(got) != "still open" {
		t.Fatalf("connection opened before SetEgress(false) carried %q, %v", got, err)
	}

	// Nothing outside connects to a sandbox.
	sl := listenIn(t, on.NetNS, on.Block.Sandbox)
	if c, err := dialIn(out.ns, sl.Addr().String()); err == nil {
		c.Close()
		t.Error("the outside connected to a sandbox")
	}
	if peer, ok := accept(sl, 50*time.Millisecond); ok {
		t.Errorf("sandbox accepted %v from the outside", peer)
	}
}

// TestPrivateDestinations: a sandbox with internet access reaches the
// internet but nothing in the private, shared (CGNAT) or link-local ranges
// — in a fleet, other hosts' sandboxd, the control plane, the clouds'
// metadata services — over TCP or UDP; its resolvers only on port 53, and
// what the operator allows (Options.Allow). Before, only TCP to link-local
// ports other than 53 was dropped.
func TestPrivateDestinations(t *testing.T) {
	r := byte(1 + rand.IntN(250))
	resolver := netip.AddrFrom4([4]byte{172, 31, r, 53})
	allowed := netip.AddrFrom4([4]byte{192, 168, 254, r})
	e := newEnv(t, func(o *Options, m *Manager) {
		if m == nil {
			o.Allow = []netip.Prefix{netip.PrefixFrom(allowed, 32)}
			return
		}
		conf := filepath.Join(t.TempDir(), "resolv.conf")
		if err := os.WriteFile(conf, []byte("nameserver "+resolver.String()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		m.resolvConf = []string{conf}
	})
	on := e.setup("on", true)
	out := e.outside()
	for _, c := range []struct {
		name string
		addr netip.Addr
		port uint16
		ok   bool
	}{
		{"the internet", netip.AddrFrom4([4]byte{198, 51, 100, r}), 80, true},
		{"RFC 1918 10/8", netip.AddrFrom4([4]byte{10, 254, r, 2}), 80, false},
		{"RFC 1918 172.16/12", netip.AddrFrom4([4]byte{172, 31, r, 2}), 80, false},
		{"RFC 1918 192.168/16", netip.AddrFrom4([4]byte{192, 168, 253, r}), 80, false},
		{"CGNAT 100.64/10", netip.AddrFrom4([4]byte{100, 127, r, 2}), 80, false},
		{"link-local, DNS port", netip.AddrFrom4([4]byte{169, 254, r, 61}), 53, false},
		{"link-local", netip.AddrFrom4([4]byte{169, 254, r, 62}), 80, false},
		{"the resolver, DNS", resolver, 53, true},
		{"the resolver, another port", resolver, 80, false},
		{"allowed by the operator", allowed, 80, true},
	} {
		out.hold(t, c.addr)
		t.Run(c.name, func(t *testing.T) {
			ap := netip.AddrPortFrom(c.addr, c.port)
			l := listenInAt(t, out.ns, ap)
			conn, err := dialIn(on.NetNS, ap.String())
			if err == nil {
				conn.Close()
			}
			if _, accepted := accept(l, 50*time.Millisecond); (err == nil) != c.ok || accepted != c.ok {
				t.Errorf("TCP to %s: dial error %v, accepted %v; want reached %v", ap, err, accepted, c.ok)
			}
			if got := udpArrives(t, on, listenUDPAt(t, out.ns, ap)); got != c.ok {
				t.Errorf("UDP to %s arrived %v, want %v", ap, got, c.ok)
			}
		})
	}
}

// hold has the outside namespace hold address a, and the host route it
// there, until the test ends.
func (o *outside) hold(t *testing.T, a netip.Addr) {
	t.Helper()
	if o.held == nil {
		o.held = map[netip.Addr]bool{}
	}
	if o.held[a] {
		return
	}
	o.held[a] = true
	err := onNSThread(enterPath(o.ns), func(netns.NsHandle) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 32))})
	})
	if err != nil {
		t.Fatal(err)
	}
	route := &netlink.Route{Dst: prefixNet(netip.PrefixFrom(a, 32)), Gw: o.addr.AsSlice()}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.RouteDel(route) }) // also goes with the outside's veth
}

// TestTeardownAndRestart: Teardown is idempotent and leaves nothing; a new
// Manager (a restarted sandboxd) keeps the egress set, lists, tears down and
// sets up sandboxes; Setup undoes its work when it fails.
func TestTeardownAndRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s1, s2 := e.setup("one", true), e.setup("two", false)

	m2, err := New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if got := egressAddrs(t, e.opts.Table); !slices.Equal(got, []netip.Addr{s1.Block.Sandbox}) {
		t.Fatalf("egress set after a new Init = %v, want [%s]", got, s1.Block.Sandbox)
	}
	if ids, err := m2.List(); err != nil || !slices.Equal(ids, []string{s1.ID, s2.ID}) {
		t.Fatalf("List = %v, %v; want [%s %s]", ids, err, s1.ID, s2.ID)
	}

	for range 2 {
		if err := m2.Teardown(ctx, s1.ID, s1.Block); err != nil {
			t.Fatalf("Teardown of the old Manager's sandbox: %v", err)
		}
	}
	if _, err := os.Stat(s1.NetNS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace file after Teardown: %v", err)
	}
	router := e.router()
	// The pair goes with the namespace, in the background.
	if !waitNoLinks(t, router, s1.HostIface, 10*time.Second) {
		t.Errorf("interface %s is left 10 s after Teardown", s1.HostIface)
	}
	if got := egressAddrs(t, e.opts.Table); len(got) != 0 {
		t.Errorf("egress set after Teardown = %v", got)
	}
	if err := m2.Teardown(ctx, "never"+e.tag, ipam.Block{}); err != nil {
		t.Errorf("Teardown of an unknown sandbox: %v", err)
	}
	if ids, _ := m2.List(); !slices.Equal(ids, []string{s2.ID}) {
		t.Errorf("List after Teardown = %v, want [%s]", ids, s2.ID)
	}

	// Setup of a sandbox that has a namespace fails and leaves it alone.
	if _, err := m2.Setup(ctx, s2.ID, s2.Block, true); !errors.Is(err, os.ErrExist) {
		t.Errorf("second Setup of %s = %v, want ErrExist", s2.ID, err)
	}
	if _, err := router.LinkByName(s2.HostIface); err != nil {
		t.Errorf("failed second Setup removed the interface: %v", err)
	}
	if _, err := os.Stat(s2.NetNS); err != nil {
		t.Errorf("failed second Setup removed the namespace file: %v", err)
	}

	// A failed Setup undoes its work, and leaves what is not its own.
	clash := "clash" + e.tag
	dummy := netlink.NewVeth(netlink.LinkAttrs{Name: m2.hostIface(clash), TxQLen: -1})
	dummy.PeerName = "ny" + e.tag
	if err := router.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = router.LinkDel(dummy) }()
	b, _ := e.ipam.Allocate(clash)
	if _, err := m2.Setup(ctx, clash, b, true); err == nil || !strings.Contains(err.Error(), clash) {
		t.Fatalf("Setup with a clashing interface = %v, want an error naming the sandbox", err)
	}
	if _, err := os.Stat(m2.nsPath(clash)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace file after a failed Setup: %v", err)
	}
	if _, err := router.LinkByName(dummy.Name); err != nil {
		t.Errorf("failed Setup deleted an interface it did not create: %v", err)
	}
	_ = router.LinkDel(dummy)

	s3 := e.setup("three", true)
	if ids, _ := m2.List(); !slices.Equal(ids, []string{s3.ID, s2.ID}) {
		t.Errorf("List = %v, want [%s %s]", ids, s3.ID, s2.ID)
	}
}

// TestStalePair: a torn-down sandbox's veth pair goes with its namespace,
// so one that something still holds keeps the pair, and with it the
// sandbox's block in the router; the next Setup of that block deletes it.
func TestStalePair(t *testing.T) {
	e := newEnv(t)
	old := e.setup("old", true)
	held, err := netns.GetFromPath(old.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := e.m.Teardown(t.Context(), old.ID, old.Block); err != nil {
		t.Fatal(err)
	}
	router := e.router()
	if _, err := router.LinkByName(old.HostIface); err != nil {
		t.Fatalf("the held namespace's pair is gone already (%v): the test shows nothing", err)
	}
	id := "new" + e.tag
	sb, err := e.m.Setup(t.Context(), id, old.Block, true)
	if err != nil {
		t.Fatalf("Setup of a stale pair's block: %v", err)
	}
	t.Cleanup(func() { _ = e.m.Teardown(context.Background(), id, old.Block) })
	if _, err := router.LinkByName(old.HostIface); err == nil {
		t.Errorf("the stale pair %s is still there", old.HostIface)
	}
	l := listenIn(t, sb.NetNS, sb.Block.Sandbox)
	c, err := net.DialTimeout("tcp4", l.Addr().String(), time.Second)
	if err != nil {
		t.Fatalf("host to the new sandbox: %v", err)
	}
	c.Close()
}

// TestRouterGone: a router namespace unmounted while a sandbox ran took
// the sandbox's interfaces with it; the next Init makes a new router, says
// which sandbox lost its network, and Teardown still cleans it up.
func TestRouterGone(t *testing.T) {
	e := newEnv(t)
	sb := e.setup("lost", true)
	if err := removeNS(e.m.routerPath()); err != nil {
		t.Fatal(err)
	}
	err := e.m.Init(t.Context())
	if !errors.Is(err, ErrNetworksLost) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("Init = %v, want ErrNetworksLost naming %s", err, sb.ID)
	}
	if !isNSMount(e.m.routerPath()) {
		t.Fatal("Init made no new router namespace")
	}
	// Once torn down, nothing is lost.
	if err := e.m.Teardown(t.Context(), sb.ID, sb.Block); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Init(t.Context()); err != nil {
		t.Fatalf("Init after the teardown = %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	pool := netip.MustParsePrefix("10.213.0.0/24")
	for _, o := range []Options{
		{Pool: pool},
		{RunDir: "/x"},
		{RunDir: "/x", Pool: netip.MustParsePrefix("fd00::/64")},
		{RunDir: "/x", Pool: netip.MustParsePrefix("0.0.0.0/0")},
		{RunDir: "/x", Pool: pool, IfacePrefix: "toolongprefix"},
		{RunDir: "/x", Pool: pool, IfacePrefix: "sk*"},
		{RunDir: "/x", Pool: pool, MTU: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
	m, err := New(Options{RunDir: "/x", Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	b := ipam.Block{Prefix: netip.MustParsePrefix("10.213.0.4/30"), Host: netip.MustParseAddr("10.213.0.5"), Sandbox: netip.MustParseAddr("10.213.0.6")}
	if err := m.check("abc123", b); err != nil {
		t.Errorf("check of a good block: %v", err)
	}
	for _, id := range []string{"", "../x", "a/b", ".", strings.Repeat("a", 65)} {
		if err := m.check(id, b); err == nil {
			t.Errorf("check accepted ID %q", id)
		}
	}
	outside := ipam.Block{Prefix: netip.MustParsePrefix("10.214.0.4/30"), Host: netip.MustParseAddr("10.214.0.5"), Sandbox: netip.MustParseAddr("10.214.0.6")}
	if err := m.check("abc", outside); err == nil {
		t.Error("check accepted a block outside the pool")
	}
	// Interface names fit IFNAMSIZ, differ by ID and are stable.
	n1, n2 := m.hostIface("k3x9q2m7v1p8z0c4t7fa"), m.hostIface("k3x9q2m7v1p8z0c4t7fb")
	if len(n1) != 15 || n1 == n2 || !strings.HasPrefix(n1, DefaultIfacePrefix) || n1 != m.hostIface("k3x9q2m7v1p8z0c4t7fa") {
		t.Errorf("hostIface = %q, %q", n1, n2)
	}
}

func TestResolvConf(t *testing.T) {
	m, err := New(Options{RunDir: "/x", Pool: netip.MustParsePrefix("10.213.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stub := write("stub", "# systemd-resolved\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch example.com\n")
	upstream := write("upstream", "nameserver 192.0.2.53\nnameserver ::1\nnameserver fd00::53\nnameserver 10.213.0.1\nnameserver  198.51.100.53 \n")
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{upstream}, "nameserver 192.0.2.53\nnameserver 198.51.100.53\n"},
		{[]string{stub, upstream}, "nameserver 192.0.2.53\nnameserver 198.51.100.53\n"},
		{[]string{filepath.Join(dir, "missing"), stub}, "#"},
	} {
		m.resolvConf = tc.paths
		if got := string(m.ResolvConf()); !strings.HasPrefix(got, tc.want) || (tc.want == "#" && strings.Contains(got, "\nnameserver")) {
			t.Errorf("ResolvConf from %v = %q, want %q", tc.paths, got, tc.want)
		}
	}
}

// BenchmarkSetupTeardown sets up and tears down one sandbox (with internet
// access) per iteration, and reports the median and 90th percentile of each
// half.
func BenchmarkSetupTeardown(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	var setup, teardown []time.Duration
	for b.Loop() {
		id := fmt.Sprintf("bench%d%s", len(setup), e.tag)
		blk, err := e.ipam.Allocate(id)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := e.m.Setup(ctx, id, blk, true); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := e.m.Teardown(ctx, id, blk); err != nil {
			b.Fatal(err)
		}
		setup, teardown = append(setup, mid.Sub(start)), append(teardown, time.Since(mid))
		e.ipam.Release(id)
	}
	for _, d := range []struct {
		name string
		ds   []time.Duration
	}{{"setup", setup}, {"teardown", teardown}} {
		slices.Sort(d.ds)
		b.ReportMetric(float64(d.ds[len(d.ds)/2].Microseconds()), d.name+"-p50-µs")
		b.ReportMetric(float64(d.ds[len(d.ds)*9/10].Microseconds()), d.name+"-p90-µs")
	}
}

// inNS runs fn on a thread in the namespace at path. fn must not call
// t.Fatal: it runs on a goroutine of its own.
func inNS(t *testing.T, path string, fn func() error) {
	t.Helper()
	if err := onNSThread(enterPath(path), func(netns.NsHandle) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

// listenIn listens on a at a free TCP port in the namespace at path (the
// socket stays in it), until the test ends.
func listenIn(t testing.TB, path string, a netip.Addr) *net.TCPListener {
	t.Helper()
	return listenInAt(t, path, netip.AddrPortFrom(a, 0))
}

func listenInAt(t testing.TB, path string, ap netip.AddrPort) *net.TCPListener {
	t.Helper()
	var l *net.TCPListener
	err := onNSThread(enterPath(path), func(netns.NsHandle) error {
		var err error
		proto := "tcp4"
		if ap.Addr().Is6() {
			proto = "tcp6"
		}
		l, err = net.ListenTCP(proto, net.TCPAddrFromAddrPort(ap))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func listenUDPIn(t *testing.T, path string, a netip.Addr) *net.UDPConn {
	t.Helper()
	return listenUDPAt(t, path, netip.AddrPortFrom(a, 0))
}

func listenUDPAt(t *testing.T, path string, ap netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := onNSThread(enterPath(path), func(netns.NsHandle) error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialIn connects from the namespace at path to addr, giving up after
// blocked.
// udpArrives sends a datagram from the sandbox to u and reports whether it
// arrived.
func udpArrives(t *testing.T, sb *Sandbox, u *net.UDPConn) bool {
	t.Helper()
	err := onNSThread(enterPath(sb.NetNS), func(netns.NsHandle) error {
		c, err := net.DialUDP("udp4", nil, u.LocalAddr().(*net.UDPAddr))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	})
	if err != nil {
		return false
	}
	_ = u.SetReadDeadline(time.Now().Add(blocked))
	_, _, err = u.ReadFrom(make([]byte, 16))
	return err == nil
}

func dialIn(path, addr string) (net.Conn, error) {
	var c net.Conn
	err := onNSThread(enterPath(path), func(netns.NsHandle) error {
		var err error
		c, err = net.DialTimeout("tcp4", addr, blocked)
		return err
	})
	return c, err
}

// accept waits up to d for a connection on l and returns its peer.
func accept(l *net.TCPListener, d time.Duration) (netip.AddrPort, bool) {
	c, ok := acceptConn(l, d)
	if !ok {
		return netip.AddrPort{}, false
	}
	defer c.Close()
	return c.RemoteAddr().(*net.TCPAddr).AddrPort(), true
}

// acceptConn waits up to d for a connection on l.
func acceptConn(l *net.TCPListener, d time.Duration) (*net.TCPConn, bool) {
	_ = l.SetDeadline(time.Now().Add(d))
	c, err := l.AcceptTCP()
	return c, err == nil
}

// hostAddr returns one of the host's IPv4 addresses outside loopback and
// the pool, where a sandbox's packets are delivered locally.
func hostAddr(t *testing.T, pool netip.Prefix) (netip.Addr, bool) {
	t.Helper()
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && !ip.IsLoopback() && !pool.Contains(ip) && !netip.MustParsePrefix("198.18.0.0/15").Contains(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

func egressAddrs(t *testing.T, table string) []netip.Addr {
	t.Helper()
	return setAddrs(t, table, egressSetName)
}

// setAddrs are the addresses in set (or the keys of map) name of table,
// sorted.
func setAddrs(t *testing.T, table, name string) []netip.Addr {
	t.Helper()
	cc, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	elems, err := cc.GetSetElements(&nftables.Set{Table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	var addrs []netip.Addr
	for _, el := range elems {
		a, _ := netip.AddrFromSlice(el.Key)
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs
}

func tableExists(tb testing.TB, name string) bool {
	tb.Helper()
	cc, err := nftables.New()
	if err != nil {
		tb.Fatal(err)
	}
	tables, err := cc.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		tb.Fatal(err)
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == name })
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func randLetters(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rand.IntN(26))
	}
	return string(b)
}

// TestTCPMetricsForgotten: what the host's TCP learns of a sandbox's
// address (an entry of the kernel's TCP metrics cache, written when the
// host closes a connection to it) goes with the sandbox's teardown, and
// Init forgets those of the pool's addresses that are left.
func TestTCPMetricsForgotten(t *testing.T) {
	e := newEnv(t)
	learned := func(a netip.Addr) bool {
		t.Helper()
		peers, err := tcpMetricsPeers()
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(peers, a)
	}
	// talk connects from the host to sb and closes first: the host's
	// socket goes through TIME_WAIT, where TCP saves what it measured.
	talk := func(sb *Sandbox) {
		t.Helper()
		l := listenIn(t, sb.NetNS, sb.Block.Sandbox)
		c, err := net.DialTimeout("tcp4", l.Addr().String(), time.Second)
		if err != nil {
			t.Fatalf("host to sandbox: %v", err)
		}
		peer, ok := acceptConn(l, time.Second)
		if !ok {
			t.Fatal("the sandbox saw no connection")
		}
		_ = c.Close()
		_, _ = peer.Read(make([]byte, 1)) // the host's FIN
		_ = peer.Close()
		deadline := time.Now().Add(5 * time.Second)
		for !learned(sb.Block.Sandbox) {
			if time.Now().After(deadline) {
				t.Fatalf("the host's TCP metrics have no entry for %s after a connection", sb.Block.Sandbox)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	a, b := e.setup("a", true), e.setup("b", true)
	talk(a)
	talk(b)
	if err := e.m.Teardown(t.Context(), a.ID, a.Block); err != nil {
		t.Fatal(err)
	}
	if learned(a.Block.Sandbox) {
		t.Errorf("the host's TCP metrics of %s outlived its sandbox", a.Block.Sandbox)
	}
	if !learned(b.Block.Sandbox) {
		t.Errorf("tearing down %s forgot %s too", a.Block.Sandbox, b.Block.Sandbox)
	}
	if err := e.m.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	if learned(b.Block.Sandbox) {
		t.Errorf("Init kept the host's TCP metrics of %s, in the pool", b.Block.Sandbox)
	}
}
