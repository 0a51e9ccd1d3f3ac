package egressproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/skiff-dev/skiff/shared/egress"
)

// clientHello is what a TLS client sends first when it dials name.
func clientHello(t *testing.T, name string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		_ = tls.Client(b, &tls.Config{ServerName: name, InsecureSkipVerify: name == ""}).Handshake() //nolint:gosec // never completes
		b.Close()
	}()
	var hello []byte
	buf := make([]byte, 4096)
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	// One record: its header gives its length.
	for len(hello) < 5 || len(hello) < 5+int(hello[3])<<8|int(hello[4]) {
		n, err := a.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		hello = append(hello, buf[:n]...)
	}
	return hello
}

func TestPeekName(t *testing.T) {
	hello := clientHello(t, "Api.Example.com")
	for _, tc := range []struct {
		what string
		port uint16
		in   []byte
		want string
		err  bool
	}{
		{"TLS", 443, hello, "api.example.com", false},
		{"TLS without SNI", 443, clientHello(t, ""), "", false},
		{"HTTP", 80, []byte("GET / HTTP/1.1\r\nHost: a.example.com\r\nUser-Agent: x\r\n\r\nbody"), "a.example.com", false},
		{"HTTP with a port", 80, []byte("GET / HTTP/1.1\r\nHost: a.example.com:80\r\n\r\n"), "a.example.com", false},
		{"HTTP with a trailing dot", 80, []byte("GET / HTTP/1.1\r\nHost: a.example.com.\r\n\r\n"), "a.example.com", false},
		{"HTTP to an address", 80, []byte("GET / HTTP/1.1\r\nHost: 10.1.2.3\r\n\r\n"), "10.1.2.3", false},
		{"not TLS on 443", 443, []byte("GET / HTTP/1.1\r\nHost: a.example.com\r\n\r\n"), "", true},
		{"not HTTP on 80", 80, []byte("SSH-2.0-OpenSSH\r\n"), "", true},
	} {
		name, seen, err := peekName(bytes.NewReader(tc.in), tc.port)
		if (err != nil) != tc.err || !equalFoldASCII(name, tc.want) {
			t.Errorf("%s: name %q, error %v; want %q, error %v", tc.what, name, err, tc.want, tc.err)
		}
		// What was read goes upstream first: it must be a prefix of what
		// came, and all of a complete request or hello.
		if !bytes.HasPrefix(tc.in, seen) {
			t.Errorf("%s: the bytes kept are not what came", tc.what)
		}
		if !tc.err && tc.port == 443 && !bytes.Equal(seen, tc.in) {
			t.Errorf("%s: kept %d of the hello's %d bytes", tc.what, len(seen), len(tc.in))
		}
	}
}

func equalFoldASCII(a, b string) bool { return bytes.EqualFold([]byte(a), []byte(b)) }

// A ClientHello that never ends is not waited for beyond what the limit
// lets through.
func TestPeekNameBounded(t *testing.T) {
	endless := io.MultiReader(bytes.NewReader([]byte{0x16, 0x03, 0x01, 0xff, 0xff}), zeros{})
	_, seen, err := peekName(endless, 443)
	if err == nil || len(seen) > maxPeek {
		t.Errorf("an endless hello: read %d bytes, error %v", len(seen), err)
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// resolverStub answers every A query on UDP and TCP on loopback with
// 192.0.2.1 and records the names asked.
type resolverStub struct {
	port  uint16
	asked chan string
}

func newResolverStub(t *testing.T) *resolverStub {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(pc.LocalAddr().(*net.UDPAddr).Port) //nolint:gosec // a port
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String())
	if err != nil {
		pc.Close()
		t.Skipf("no TCP port to match UDP port %d: %v", port, err)
	}
	s := &resolverStub{port: port, asked: make(chan string, 100)}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(s.reply(t, buf[:n]), from)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			q, err := readTCPMessage(c)
			if err == nil {
				_ = writeTCPMessage(c, s.reply(t, q))
			}
			c.Close()
		}
	}()
	return s
}

func (s *resolverStub) reply(t *testing.T, query []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(query); err != nil {
		t.Error(err)
		return nil
	}
	m.Response = true
	for _, q := range m.Questions {
		s.asked <- q.Name.String()
		m.Answers = append(m.Answers, dnsmessage.Resource{
			Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
			Body:   &dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}},
		})
	}
	out, err := m.Pack()
	if err != nil {
		t.Error(err)
	}
	return out
}

func query(t *testing.T, names ...string) []byte {
	t.Helper()
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: 7, RecursionDesired: true}}
	for _, n := range names {
		m.Questions = append(m.Questions, dnsmessage.Question{Name: dnsmessage.MustNewName(n), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDNSAnswer: allowed names are asked of the host's resolver and its
// answer passed on; any other name, or a query from an address with no
// rules, is REFUSED without a query leaving.
func TestDNSAnswer(t *testing.T) {
	stub := newResolverStub(t)
	sbs := NewSandboxes()
	sandbox := netip.MustParseAddr("10.11.0.2")
	sbs.Set(sandbox, "team-a", egress.Effective([]string{"allowed.test", "*.wild.test"}, []string{"0.0.0.0/0"}, nil))
	d := NewDNS(Options{
		Sandboxes: sbs, Permitted: func(netip.Addr) bool { return true },
		Resolvers:    func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("127.0.0.1")} },
		ResolverPort: stub.port,
	})
	ctx := context.Background()
	for _, tc := range []struct {
		from    netip.Addr
		names   []string
		network string
		want    dnsmessage.RCode
		asked   bool
	}{
		{sandbox, []string{"allowed.test."}, "udp", dnsmessage.RCodeSuccess, true},
		{sandbox, []string{"ALLOWED.test."}, "tcp", dnsmessage.RCodeSuccess, true},
		{sandbox, []string{"a.b.wild.test."}, "udp", dnsmessage.RCodeSuccess, true},
		{sandbox, []string{"wild.test."}, "udp", dnsmessage.RCodeRefused, false},
		{sandbox, []string{"other.test."}, "tcp", dnsmessage.RCodeRefused, false},
		{sandbox, []string{"allowed.test.", "other.test."}, "udp", dnsmessage.RCodeRefused, false},
		{netip.MustParseAddr("10.11.0.6"), []string{"allowed.test."}, "udp", dnsmessage.RCodeRefused, false},
	} {
		ans := d.answer(ctx, tc.from, query(t, tc.names...), tc.network)
		var m dnsmessage.Message
		if err := m.Unpack(ans); err != nil {
			t.Fatalf("%v from %s: %v", tc.names, tc.from, err)
		}
		if m.RCode != tc.want || m.ID != 7 || !m.Response || len(m.Questions) != len(tc.names) {
			t.Errorf("%v from %s over %s: %v", tc.names, tc.from, tc.network, m.Header)
		}
		select {
		case n := <-stub.asked:
			if !tc.asked {
				t.Errorf("%v from %s: %s reached the resolver", tc.names, tc.from, n)
			}
		case <-time.After(50 * time.Millisecond):
			if tc.asked {
				t.Errorf("%v from %s: the resolver was not asked", tc.names, tc.from)
			}
		}
	}
	// A response, or garbage, is dropped.
	if ans := d.answer(ctx, sandbox, []byte{1, 2, 3}, "udp"); ans != nil {
		t.Errorf("garbage answered: %x", ans)
	}
}

// serveConns closes what it serves when its context ends, and closes a
// connection over its bound at once.
func TestServeConns(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{}, 2)
	done := make(chan error, 1)
	go func() {
		done <- serveConns(ctx, ln, newShares(1, DefaultTeamShare, func(netip.Addr) string { return "" }), slogDiscard(), "test", func(c net.Conn) {
			started <- struct{}{}
			_, _ = io.Copy(io.Discard, c) // until closed
		})
	}()
	first, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	<-started
	second, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	_ = second.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := second.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a connection over the bound: %v, want EOF", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serveConns: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serveConns did not return when its context ended")
	}
	_ = first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the served connection after the end: %v, want EOF", err)
	}
}

// One sandbox (a source address) holds at most its share of serveConns'
// connections, and one team's sandboxes theirs together: past it the next
// is closed at once, and another sandbox's, another team's, is served.
func TestServeConnsShared(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// 2 a sandbox, 8 a team; 127.0.0.1 to .5 are team-a's.
	teams := func(a netip.Addr) string {
		if a.As4()[3] <= 5 {
			return "team-a"
		}
		return "team-b"
	}
	started := make(chan struct{}, 16)
	go func() {
		_ = serveConns(t.Context(), ln, newShares(2*perSandbox, DefaultTeamShare, teams), slogDiscard(), "test", func(c net.Conn) {
			started <- struct{}{}
			_, _ = io.Copy(io.Discard, c) // until closed
		})
	}()
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	served := func(from string) {
		t.Helper()
		dial(from)
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatalf("a connection from %s was not served", from)
		}
	}
	refused := func(from, why string) {
		t.Helper()
		over := dial(from)
		_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := over.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("a connection from %s past %s: %v, want EOF", from, why, err)
		}
	}
	served("127.0.0.1")
	served("127.0.0.1")
	refused("127.0.0.1", "its sandbox's share of 2")
	for _, from := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		served(from)
		served(from)
	}
	// team-a's fifth sandbox has all its own share left, its team none.
	refused("127.0.0.5", "team-a's share of 8")
	served("127.0.0.6")
}

// A team share of 1 bounds no team: one team's sandboxes take every slot,
// each within its own share.
func TestSharesWithoutTeamBound(t *testing.T) {
	s := newShares(32, 1, func(netip.Addr) string { return "team-a" })
	for i := range 32 {
		src := netip.AddrFrom4([4]byte{10, 0, 0, byte(i / 2)})
		if _, r := s.take(src); r != taken {
			t.Fatalf("take %d: refused (%d)", i+1, r)
		}
	}
	if _, r := s.take(netip.AddrFrom4([4]byte{10, 0, 0, 100})); r != allFull {
		t.Fatalf("a take past every slot: %d, want allFull", r)
	}
	s.put(netip.AddrFrom4([4]byte{10, 0, 0, 0}), "team-a")
	if team, r := s.take(netip.AddrFrom4([4]byte{10, 0, 0, 100})); r != taken || team != "team-a" {
		t.Fatalf("a take after a put: %q %d", team, r)
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A tracked sandbox's context ends when it is deleted, not when its rules
// change, restricting or not; an update of one not tracked tracks nothing;
// a sandbox set again at an address after a delete has a context of its
// own.
func TestSandboxesEnd(t *testing.T) {
	s := NewSandboxes()
	addr := netip.MustParseAddr("10.11.0.2")
	s.Update(addr, egress.Rules{})
	if s.Len() != 0 {
		t.Fatal("an update of a sandbox not tracked tracked it")
	}
	s.Set(addr, "team-a", egress.Effective(nil, []string{egress.AllTraffic}, nil))
	_, ctx, ok := s.lookup(addr)
	if !ok {
		t.Fatal("a sandbox set is not tracked")
	}
	s.Set(addr, "team-a", egress.Effective([]string{"a.test"}, []string{egress.AllTraffic}, nil))
	s.Update(addr, egress.Effective(nil, nil, nil))
	if ctx.Err() != nil {
		t.Fatal("a change of rules ended the sandbox's context")
	}
	if r, _ := s.Get(addr); r.Restricts() {
		t.Fatalf("rules after the update: %+v, want the last ones", r)
	}
	s.Delete(addr)
	if ctx.Err() == nil || s.Len() != 0 {
		t.Fatal("a delete did not end the sandbox's context")
	}
	s.Set(addr, "team-a", egress.Effective(nil, []string{egress.AllTraffic}, nil))
	if _, again, _ := s.lookup(addr); again.Err() != nil {
		t.Fatal("the next sandbox at the address has an ended context")
	}
}
