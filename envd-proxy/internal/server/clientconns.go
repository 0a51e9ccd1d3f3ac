package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
)

// perClient counts what each client address holds: its open connections
// (limitListener), so that one client cannot hold every connection the
// proxy can take (slow bodies, or merely many idle connections), or, for
// the clients of a trusted proxy, its requests in flight (forwarded.go).
// A connection beyond max is still accepted, but marked: each request on
// it is answered by the over-limit handler (429) and the connection
// closed, which tells an HTTP client more than a reset would. Over-limit
// connections are not counted; the server's header timeout bounds the
// ones that send nothing.
type perClient struct {
	max int

	mu   sync.Mutex
	held map[netip.Addr]int
}

func newPerClient(max int) *perClient {
	return &perClient{max: max, held: make(map[netip.Addr]int)}
}

// acquire counts one more for addr unless addr is at the cap.
func (c *perClient) acquire(addr netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[addr] >= c.max {
		return false
	}
	c.held[addr]++
	return true
}

func (c *perClient) release(addr netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[addr]--; c.held[addr] <= 0 {
		delete(c.held, addr)
	}
}

// limitListener marks each accepted connection with whether its client is
// within the cap; a connection from a trusted proxy is not counted, but
// marked as such (see forwarded.go).
type limitListener struct {
	net.Listener
	conns   *perClient
	trusted []netip.Prefix
}

func (l *limitListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	addr := clientAddr(conn.RemoteAddr())
	if !addr.IsValid() { // not TCP: nothing to count by
		return conn, nil
	}
	if trusted(addr, l.trusted) {
		return &countedConn{Conn: conn, addr: addr, viaProxy: true}, nil
	}
	if !l.conns.acquire(addr) {
		return &countedConn{Conn: conn, over: true}, nil
	}
	return &countedConn{Conn: conn, addr: addr, conns: l.conns}, nil
}

// clientAddr is the IP of a TCP peer, IPv4-mapped IPv6 unmapped; the zero
// Addr for anything else.
func clientAddr(a net.Addr) netip.Addr {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// countedConn releases its client's count once, on its first Close. One
// from a trusted proxy (viaProxy) is not counted.
type countedConn struct {
	net.Conn
	over     bool
	viaProxy bool
	addr     netip.Addr
	conns    *perClient
	once     sync.Once
}

func (c *countedConn) Close() error {
	if c.conns != nil {
		c.once.Do(func() { c.conns.release(c.addr) })
	}
	return c.Conn.Close()
}

// ReadFrom and WriteTo keep the TCP connection's fast paths (sendfile,
// splice) that embedding the interface would hide.
func (c *countedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(onlyWriter{c.Conn}, r)
}

func (c *countedConn) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := c.Conn.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.Copy(w, onlyReader{c.Conn})
}

// CloseWrite lets the HTTP server half-close a connection it is done with
// (it sends FIN and lets the client read the last answer).
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

type onlyWriter struct{ io.Writer }

type onlyReader struct{ io.Reader }

type connKey struct{}

// markConn is the server's ConnContext: it records in a connection's
// context the connection as the listener counted it (beyond its client's
// cap, or from a trusted proxy). TLS wraps the listener's connections, so
// it looks underneath.
func markConn(ctx context.Context, c net.Conn) context.Context {
	for {
		switch cc := c.(type) {
		case *countedConn:
			if cc.over || cc.viaProxy {
				return context.WithValue(ctx, connKey{}, cc)
			}
			return ctx
		case interface{ NetConn() net.Conn }:
			c = cc.NetConn()
		default:
			return ctx
		}
	}
}

// clientLimits answers every request on an over-limit connection with
// over; a request on a trusted proxy's connection goes to next while its
// client (forwardedClient) has fewer than reqs' cap in flight, and to
// tooMany beyond. The others go to next.
func clientLimits(next, over, tooMany http.Handler, reqs *perClient, prefixes []netip.Prefix) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc, _ := r.Context().Value(connKey{}).(*countedConn)
		switch {
		case cc == nil:
			next.ServeHTTP(w, r)
		case cc.over:
			over.ServeHTTP(w, r)
		default:
			client := forwardedClient(r, cc.addr, prefixes)
			if !reqs.acquire(client) {
				tooMany.ServeHTTP(w, r)
				return
			}
			defer reqs.release(client)
			next.ServeHTTP(w, r)
		}
	})
}
