package egressproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Proxy is the egress proxy for redirected TCP to ports 443 and 80.
type Proxy struct {
	o   Options
	res *net.Resolver
}

// maxConns bounds the connections the proxy holds at once, for all
// sandboxes (a sixteenth of them for one, a quarter for one team's); one
// over it is closed at once.
const maxConns = 16384

// NewProxy returns a proxy; Serve runs it.
func NewProxy(o Options) *Proxy {
	o.defaults()
	return &Proxy{o: o, res: resolver(&o)}
}

// Serve takes connections on ln until ctx ends, then closes ln and the
// connections it relays (what sandboxd relays ends with it) and waits for
// them.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	return serveConns(ctx, ln, newShares(maxConns, p.o.TeamShare, p.o.Sandboxes.Team), p.o.Logger, "egress proxy", func(c net.Conn) { p.handle(ctx, c.(*net.TCPConn)) })
}

// handle decides one redirected connection and relays it, or closes it.
func (p *Proxy) handle(ctx context.Context, c *net.TCPConn) {
	defer c.Close()
	src, ok := netip.AddrFromSlice(c.RemoteAddr().(*net.TCPAddr).IP)
	if !ok {
		return
	}
	src = src.Unmap()
	rules, sandbox, ok := p.o.Sandboxes.lookup(src)
	if !ok {
		return // not a sandbox with rules (or one just gone)
	}
	// What is relayed for the sandbox ends when it is forgotten.
	stopSandbox := context.AfterFunc(sandbox, func() { _ = c.Close() })
	defer stopSandbox()
	dst, err := originalDst(c)
	if err != nil {
		p.o.Logger.Warn("egress proxy: a connection without its original destination", "from", src, "error", err)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(p.o.PeekTimeout))
	name, head, err := peekName(c, dst.Port())
	_ = c.SetReadDeadline(time.Time{})
	if err != nil && len(head) == 0 {
		return // nothing sent
	}
	log := p.o.Logger.With("sandbox_addr", src, "to", dst, "name", name)
	var up net.Conn
	switch {
	case name != "" && rules.AllowsName(name):
		up, err = p.dialName(ctx, name, dst.Port())
	case p.o.Permitted(dst.Addr()) && rules.AllowsAddr(dst.Addr()):
		up, err = p.dial(ctx, dst)
	default:
		log.Debug("egress proxy: refused")
		return
	}
	if err != nil {
		log.Debug("egress proxy: dial failed", "error", err)
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { _ = up.Close() })
	defer stop()
	stopUp := context.AfterFunc(sandbox, func() { _ = up.Close() })
	defer stopUp()
	if _, err := up.Write(head); err != nil {
		return
	}
	relay(c, up)
}

// dial connects to addr.
func (p *Proxy) dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: p.o.DialTimeout}
	return d.DialContext(ctx, "tcp4", addr.String())
}

// dialName resolves name with the host's resolver and connects to the
// first of its addresses the operator permits.
func (p *Proxy) dialName(ctx context.Context, name string, port uint16) (net.Conn, error) {
	lctx, cancel := context.WithTimeout(ctx, p.o.DialTimeout)
	defer cancel()
	addrs, err := p.res.LookupNetIP(lctx, "ip4", name)
	if err != nil {
		return nil, err
	}
	last := fmt.Errorf("%s resolves to no address sandboxes may reach", name)
	for _, a := range addrs {
		if !p.o.Permitted(a) {
			continue
		}
		c, err := p.dial(ctx, netip.AddrPortFrom(a.Unmap(), port))
		if err == nil {
			return c, nil
		}
		last = err
	}
	return nil, last
}

// relay copies both ways until both ends are done, passing on each
// direction's end (a half close).
func relay(a, b net.Conn) {
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Go(func() { pipe(b, a) })
	pipe(a, b)
	wg.Wait()
}

// originalDst is where a redirected connection was going (SO_ORIGINAL_DST).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var (
		out  netip.AddrPort
		serr error
	)
	err = raw.Control(func(fd uintptr) {
		// A sockaddr_in: family, port, address.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return out, serr
}

// peekName reads the first bytes of a connection to port 443 (a TLS
// ClientHello) or 80 (an HTTP request head) and returns the name they are
// for ("" when they name none) and every byte read, which the upstream
// gets first.
func peekName(r io.Reader, port uint16) (string, []byte, error) {
	var seen bytes.Buffer
	tee := io.TeeReader(io.LimitReader(r, maxPeek), &seen)
	var name string
	var err error
	if port == 80 {
		name, err = httpHost(tee)
	} else {
		name, err = tlsServerName(tee)
	}
	return name, seen.Bytes(), err
}

// maxPeek bounds what is read before deciding.
const maxPeek = 64 << 10

// httpHost is the Host of an HTTP request head, without a port.
func httpHost(r io.Reader) (string, error) {
	req, err := http.ReadRequest(bufio.NewReader(r))
	if err != nil {
		return "", err
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(host, "."), nil
}

var errGotHello = errors.New("got the ClientHello")

// tlsServerName is the server name (SNI) of a TLS ClientHello: crypto/tls
// parses it, as a server would, and stops there.
func tlsServerName(r io.Reader) (string, error) {
	var name string
	err := tls.Server(readOnly{r}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, errGotHello
	}}).Handshake()
	if errors.Is(err, errGotHello) {
		return name, nil
	}
	return "", err
}

// readOnly is a net.Conn over a reader that writes nothing (the handshake
// above never answers).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(b []byte) (int, error)     { return c.r.Read(b) }
func (readOnly) Write([]byte) (int, error)        { return 0, io.ErrClosedPipe }
func (readOnly) Close() error                     { return nil }
func (readOnly) LocalAddr() net.Addr              { return nil }
func (readOnly) RemoteAddr() net.Addr             { return nil }
func (readOnly) SetDeadline(time.Time) error      { return nil }
func (readOnly) SetReadDeadline(time.Time) error  { return nil }
func (readOnly) SetWriteDeadline(time.Time) error { return nil }
