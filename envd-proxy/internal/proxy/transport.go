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

// NewTransport returns the transport to sandboxd: plain HTTP/1.1 (which
// upgrades, WebSocket included, need), a large keep-alive pool per host, no
// timeout on a response (streams last as long as they last, and an
// auto-resume may take seconds before the first byte), and no compression
// of its own, so bodies pass byte for byte. Bytes on its connections are
// counted in m (nil: not counted).
func NewTransport(o TransportOptions, m *Metrics) *http.Transport {
	o.defaults()
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	dial := d.DialContext
	if m != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c, sent: m.toSandbox, received: m.fromSandbox}, nil
		}
	}
	return &http.Transport{
		Proxy:                 nil, // never through an HTTP_PROXY of the environment
		DialContext:           dial,
		MaxIdleConns:          0, // no limit beyond the per-host one
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ReadBufferSize:        o.BufferSize,
		WriteBufferSize:       o.BufferSize,
		// An answer comes from a sandbox's server, its tenant's: its
		// headers are held to what the proxy takes of a request's (Go's
		// default, 10 MiB, let one tenant pin that much per request).
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
}

// maxResponseHeaderBytes bounds the headers of an answer the proxy
// passes on; past it the client gets 502.
const maxResponseHeaderBytes = 1 << 20

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
