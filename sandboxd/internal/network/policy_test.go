package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/skiff-dev/skiff/sandboxd/internal/egressproxy"
	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/shared/egress"
)

// withFilters runs an egress proxy and a DNS filter (UDP) on loopback for
// the env's Manager, which redirects to them; the table tells them each
// sandbox's rules.
func withFilters(tb testing.TB) (func(*Options, *Manager), *egressproxy.Sandboxes) {
	at := netip.AddrPortFrom(FilterAddr, 0).String()
	ln, err := net.Listen("tcp4", at)
	if err != nil {
		tb.Fatal(err)
	}
	pc, err := net.ListenPacket("udp4", at)
	if err != nil {
		tb.Fatal(err)
	}
	sbs := egressproxy.NewSandboxes()
	return func(o *Options, m *Manager) {
		if m == nil {
			o.EgressProxyPort = uint16(ln.Addr().(*net.TCPAddr).Port)    //nolint:gosec // a port
			o.DNSFilterPort = uint16(pc.LocalAddr().(*net.UDPAddr).Port) //nolint:gosec // a port
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		fo := egressproxy.Options{Sandboxes: sbs, Permitted: m.Permitted, Resolvers: m.Resolvers}
		p, d := egressproxy.NewProxy(fo), egressproxy.NewDNS(fo)
		done := make(chan struct{}, 2)
		go func() { _ = p.Serve(ctx, ln); done <- struct{}{} }()
		go func() { _ = d.ServeUDP(ctx, pc); done <- struct{}{} }()
		tb.Cleanup(func() { cancel(); <-done; <-done })
	}, sbs
}

// serveHTTP answers "ok <Host>" on addr in the namespace at path.
func serveHTTP(tb testing.TB, path string, addr netip.AddrPort) {
	ln := listenInAt(tb, path, addr)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s", r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
}

// get sends one HTTP request for host to addr from the sandbox and returns
// the body.
func get(sb *Sandbox, addr, host string) (string, error) {
	c, err := dialIn(sb.NetNS, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestPolicy: a sandbox's own rules in the kernel (allow over deny,
// refusals seen at once as ENETUNREACH) and through the egress proxy (a
// name decides port 80, an address without an allowed name is closed);
// its rules outlive nothing of a new Init but keep it refused; clearing
// them gives back plain internet access.
func TestPolicy(t *testing.T) {
	proxy, sbs := withFilters(t)
	e := newEnv(t, proxy)
	out := e.outside()
	sb := e.setup("pol", true)
	web := netip.AddrPortFrom(out.addr, 80)
	serveHTTP(t, out.ns, web)
	other := e.outside() // a second address, denied
	serveHTTP(t, other.ns, netip.AddrPortFrom(other.addr, 80))
	otherWeb := netip.AddrPortFrom(other.addr, 80).String()

	set := func(allow, deny []string) egress.Rules {
		t.Helper()
		r := egress.Effective(allow, deny, nil)
		if err := e.m.SetPolicy(sb.ID, sb.Block, true, r); err != nil {
			t.Fatal(err)
		}
		if r.Restricts() {
			sbs.Set(sb.Block.Sandbox, "team-a", r)
		} else {
			sbs.Delete(sb.Block.Sandbox)
		}
		return r
	}

	// Addresses: in the kernel.
	set(nil, []string{other.addr.String()})
	if got, err := get(sb, web.String(), "x"); err != nil || got != "ok x" {
		t.Errorf("an address not denied: %q, %v", got, err)
	}
	if _, err := get(sb, otherWeb, "x"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("a denied address: %v, want ENETUNREACH", err)
	}
	set([]string{other.addr.String()}, []string{egress.AllTraffic, other.addr.String()})
	if got, err := get(sb, otherWeb, "x"); err != nil || got != "ok x" {
		t.Errorf("allowed over denied: %q, %v", got, err)
	}
	if _, err := get(sb, web.String(), "x"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("all denied: %v, want ENETUNREACH", err)
	}

	// A name: port 80 goes through the proxy, which reads the Host. The
	// name's own resolution is the proxy's; here, none resolves, so only
	// an allowed address gets through, and a name alone is closed.
	set([]string{"allowed.test", other.addr.String()}, []string{egress.AllTraffic})
	if got, err := get(sb, otherWeb, other.addr.String()); err != nil || got != "ok "+other.addr.String() {
		t.Errorf("an allowed address through the proxy: %q, %v", got, err)
	}
	if got, err := get(sb, web.String(), "refused.test"); err == nil {
		t.Errorf("a refused name at a denied address answered %q", got)
	}

	// A new Init (sandboxd restarted) keeps the sandbox refused, but for
	// its resolvers, until its rules are set again.
	set(nil, []string{other.addr.String()})
	if err := e.m.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := get(sb, web.String(), "x"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("after a new Init, before the rules are set again: %v, want ENETUNREACH", err)
	}
	set(nil, []string{other.addr.String()})
	if got, err := get(sb, web.String(), "x"); err != nil || got != "ok x" {
		t.Errorf("rules set again: %q, %v", got, err)
	}
	if _, err := get(sb, otherWeb, "x"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("rules set again, a denied address: %v, want ENETUNREACH", err)
	}

	// No rules: internet access as before.
	set(nil, nil)
	if got, err := get(sb, web.String(), "x"); err != nil || got != "ok x" {
		t.Errorf("rules cleared: %q, %v", got, err)
	}
	if chains := sandboxChains(t, e); len(chains) != 0 {
		t.Errorf("chains left after the rules were cleared: %v", chains)
	}
	// Rules again, then Teardown removes them.
	set(nil, []string{egress.AllTraffic})
	if chains := sandboxChains(t, e); !slices.Equal(chains, []string{sandboxChainPre + sb.ID}) {
		t.Errorf("chains = %v, want the sandbox's", chains)
	}
}

// A connection the egress proxy relays for a sandbox ends when the sandbox
// is forgotten (killed, or its rules cleared), though the server it
// reaches never answers nor closes: it would otherwise hold its slot,
// counted against the next sandbox at that address, until sandboxd
// restarts.
func TestProxiedConnectionsEndWithTheSandbox(t *testing.T) {
	proxy, sbs := withFilters(t)
	e := newEnv(t, proxy)
	out := e.outside()
	sb := e.setup("end", true)
	silent := listenInAt(t, out.ns, netip.AddrPortFrom(out.addr, 80))
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads, never answers
		}
	}()
	r := egress.Effective([]string{"allowed.test", out.addr.String()}, []string{egress.AllTraffic}, nil)
	if err := e.m.SetPolicy(sb.ID, sb.Block, true, r); err != nil {
		t.Fatal(err)
	}
	sbs.Set(sb.Block.Sandbox, "team-a", r)
	c, err := dialIn(sb.NetNS, netip.AddrPortFrom(out.addr, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", out.addr); err != nil {
		t.Fatal(err)
	}
	// Relayed: the server holds the connection open, answering nothing.
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the relayed connection before the sandbox is forgotten: %d bytes, %v; want it open and silent", n, err)
	}
	sbs.Delete(sb.Block.Sandbox)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
		t.Fatalf("the relayed connection after the sandbox was forgotten: %v, want it ended", err)
	}
}

// TestOrphanTeardown: the orphan sweep tears down a sandbox whose block
// sandboxd no longer knows (the zero Block). Its address is read from its
// namespace, with or without a new Init (sandboxd restarted, which empties
// the verdict map but keeps the sets); its map entry, set elements and
// chain go, so that the next sandbox at that address is neither refused
// nor filtered.
func TestOrphanTeardown(t *testing.T) {
	proxy, _ := withFilters(t)
	e := newEnv(t, proxy)
	ctx := context.Background()
	out := e.outside()
	web := netip.AddrPortFrom(out.addr, 80)
	serveHTTP(t, out.ns, web)
	// A name allowed and all else denied: ruled, proxied and DNS filtered.
	r := egress.Effective([]string{"allowed.test"}, []string{egress.AllTraffic}, nil)
	sets := []string{rulesMapName, ruledSetName, proxiedSetName, dnsFilteredName}
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			id := fmt.Sprintf("orphan%v%s", restart, e.tag)
			b, err := e.ipam.Allocate(id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.m.Setup(ctx, id, b, false); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.m.Teardown(context.Background(), id, b) })
			if err := e.m.SetPolicy(id, b, true, r); err != nil {
				t.Fatal(err)
			}
			if restart {
				if err := e.m.Init(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range sets[1:] {
				if !slices.Contains(setAddrs(t, e.opts.Table, name), b.Sandbox) {
					t.Fatalf("%s is not in set %s: the test shows nothing", b.Sandbox, name)
				}
			}

			if err := e.m.Teardown(ctx, id, ipam.Block{}); err != nil {
				t.Fatalf("Teardown of an orphan: %v", err)
			}
			for _, name := range append(sets, egressSetName) {
				if slices.Contains(setAddrs(t, e.opts.Table, name), b.Sandbox) {
					t.Errorf("%s is still in %s after the orphan's Teardown", b.Sandbox, name)
				}
			}
			if slices.Contains(sandboxChains(t, e), sandboxChainPre+id) {
				t.Errorf("the orphan's chain is still there")
			}

			// The next sandbox at the address, without rules, reaches
			// the internet.
			next := "next" + id
			sb, err := e.m.Setup(ctx, next, b, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := e.m.Teardown(context.Background(), next, b); err != nil {
					t.Error(err)
				}
			})
			if got, err := get(sb, web.String(), "x"); err != nil || got != "ok x" {
				t.Errorf("the next sandbox at the orphan's address: %q, %v", got, err)
			}
		})
	}
}

// sandboxChains lists the per-sandbox chains of the env's table.
func sandboxChains(t *testing.T, e *env) []string {
	t.Helper()
	cc, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := cc.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range chains {
		if c.Table.Name == e.opts.Table && strings.HasPrefix(c.Name, sandboxChainPre) {
			out = append(out, c.Name)
		}
	}
	return out
}

// BenchmarkConnect is what a sandbox's rules add to a connection: from
// inside a sandbox, connect to a web server outside and read its answer,
// with no rules, with rules in the kernel only (an address denied), and
// through the egress proxy (a sandbox whose rules allow a name: its port
// 80 is proxied, here to an allowed address).
func BenchmarkConnect(b *testing.B) {
	proxy, sbs := withFilters(b)
	e := newEnv(b, proxy)
	out := e.outside()
	web := netip.AddrPortFrom(out.addr, 80)
	serveHTTP(b, out.ns, web)
	for _, tc := range []struct {
		name        string
		allow, deny []string
	}{
		{"none", nil, nil},
		{"kernel", nil, []string{"192.0.2.0/24"}},
		{"proxy", []string{"allowed.test", out.addr.String()}, []string{egress.AllTraffic}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			sb := e.setup("bc"+tc.name[:1], true)
			r := egress.Effective(tc.allow, tc.deny, nil)
			if err := e.m.SetPolicy(sb.ID, sb.Block, true, r); err != nil {
				b.Fatal(err)
			}
			if r.Restricts() {
				sbs.Set(sb.Block.Sandbox, "team-a", r)
			}
			var ds []time.Duration
			for b.Loop() {
				start := time.Now()
				if got, err := get(sb, web.String(), out.addr.String()); err != nil || !strings.HasPrefix(got, "ok") {
					b.Fatalf("%q, %v", got, err)
				}
				ds = append(ds, time.Since(start))
			}
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds()), "p90-µs")
		})
	}
}
