package proxy

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TransportOptions tune the connections to sandboxd.
type TransportOptions struct {
	// MaxIdleConnsPerHost is how many idle keep-alive connections to one
	// sandboxd are kept for reuse. Default 1024: a proxy in front of
	// thousands of SDK clients spreads over a handful of hosts.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes an unused connection; it must stay below
	// sandboxd's own idle timeout (620 s) so the proxy, not sandboxd, closes
	// it and no request is sent on a connection being closed. Default 90 s.
	IdleConnTimeout time.Duration
	// DialTimeout bounds connecting to a sandboxd. Default 5 s.
	DialTimeout time.Duration
	// BufferSize is the size of each connection's read and write buffers.
	// Default 16 KiB.
	BufferSize int
	// SpliceAbove, when above 0, sends plain GETs on the proxy's own
	// connections (getPath): a body of known length above this many bytes
	// goes from sandboxd's socket to a plain HTTP/1.1 client's with
	// splice(2), and other bodies are read through a 64 KiB buffer. 0, the
	// default, sends GETs through http.Transport like every other request:
	// on the machine measured so far, getPath made whole-system downloads
	// no faster (docs/envd-proxy.md, Performance).
	SpliceAbove int64
}

func (o *TransportOptions) defaults() {
	if o.MaxIdleConnsPerHost <= 0 {
		o.MaxIdleConnsPerHost = 1024
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.BufferSize <= 0 {
		o.BufferSize = 16 << 10
	}
}

// Transport is the RoundTripper to sandboxd: an http.Transport and, with
// TransportOptions.SpliceAbove, getPath for plain GETs (no body, no
// upgrade: envd's GET /files, and reads of a sandbox's own ports), whose
// connections the proxy owns so that it can splice a large body from
// sandboxd's socket to the client's. Everything else — request bodies,
// upgrades, Connect calls (POST) — always goes through the http.Transport.
type Transport struct {
	std *http.Transport
	get *getPath // nil: GETs take std too
}

// NewTransport returns the transport to sandboxd: plain HTTP/1.1 (which
// upgrades, WebSocket included, need), a large keep-alive pool per host, no
// timeout on a response (streams last as long as they last, and an
// auto-resume may take seconds before the first byte), and no compression
// of its own, so bodies pass byte for byte. Bytes on its connections are
// counted in m (nil: not counted).
func NewTransport(o TransportOptions, m *Metrics) *Transport {
	o.defaults()
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	var sent, received prometheus.Counter
	if m != nil {
		sent, received = m.toSandbox, m.fromSandbox
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil || sent == nil {
			return c, err
		}
		return &countingConn{Conn: c, sent: sent, received: received}, nil
	}
	t := &Transport{std: &http.Transport{
		Proxy:                 nil, // never through an HTTP_PROXY of the environment
		DialContext:           dial,
		MaxIdleConns:          0, // no limit beyond the per-host one
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ReadBufferSize:        o.BufferSize,
		WriteBufferSize:       o.BufferSize,
	}}
	if o.SpliceAbove > 0 {
		t.get = &getPath{
			dial: dial, received: received, bufSize: o.BufferSize, spliceAbove: o.SpliceAbove,
			maxIdle: o.MaxIdleConnsPerHost, idleTimeout: o.IdleConnTimeout, idle: map[string][]*upConn{},
		}
	}
	return t
}

// RoundTrip sends a request to sandboxd.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.get != nil && plainGET(req) {
		return t.get.roundTrip(req)
	}
	return t.std.RoundTrip(req)
}

// plainGET reports whether req is a GET without a body or an upgrade, over
// plain HTTP: what getPath serves.
func plainGET(req *http.Request) bool {
	return req.Method == http.MethodGet && req.URL.Scheme == "http" && req.URL.Host != "" &&
		(req.Body == nil || req.Body == http.NoBody) && req.ContentLength == 0 &&
		len(req.TransferEncoding) == 0 && req.Header.Get("Upgrade") == ""
}

// CloseIdleConnections closes the idle connections of both paths.
func (t *Transport) CloseIdleConnections() {
	t.std.CloseIdleConnections()
	if t.get != nil {
		t.get.closeIdle()
	}
}

// countingConn counts the bytes read from and written to a connection.
type countingConn struct {
	net.Conn
	sent, received prometheus.Counter
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.received.Add(float64(n))
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.sent.Add(float64(n))
	}
	return n, err
}

// tcpConn returns the TCP connection under c (nil if there is none), the
// one splice(2) reads from.
func tcpConn(c net.Conn) *net.TCPConn {
	if cc, ok := c.(*countingConn); ok {
		c = cc.Conn
	}
	tc, _ := c.(*net.TCPConn)
	return tc
}
