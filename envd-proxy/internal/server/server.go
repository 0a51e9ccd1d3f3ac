// Package server runs the envd proxy's two listeners: the proxy itself
// (HTTP/1.1, plus HTTP/2 through ALPN when it serves TLS) and the admin port
// (/metrics, /healthz, /readyz). On shutdown it stops accepting, lets every
// request in flight — long streams and upgraded connections included —
// finish within the shutdown timeout, then cuts what is left.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skiff-dev/skiff/shared/daemon"
)

const (
	readHeaderTimeout = 10 * time.Second
	maxHeaderBytes    = 1 << 20
	// maxConcurrentStreams is how many requests one HTTP/2 client
	// connection may have open; the e2b SDKs allow 2,000 in flight.
	maxConcurrentStreams = 1000
)

// Config is what Serve needs.
type Config struct {
	// Handler serves the proxy listener.
	Handler http.Handler
	// TLS, if set, makes the proxy listener serve TLS, offering h2 and
	// http/1.1 through ALPN.
	TLS *tls.Config
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout time.Duration
	// MaxConnsPerClient caps the open connections of one client address;
	// each request on a connection beyond it gets OverLimit, and the
	// connection closes. 0 means no cap.
	MaxConnsPerClient int
	// OverLimit answers the requests of a connection beyond
	// MaxConnsPerClient; it should set "Connection: close". Nil answers a
	// plain 429.
	OverLimit http.Handler
	// TrustedProxies are the addresses of reverse proxies in front of
	// this one (an L7 ingress): their connections are not counted, and
	// each request on one counts, while in flight, against
	// MaxConnsPerClient for the client its X-Forwarded-For names.
	TrustedProxies []netip.Prefix
	// TooManyRequests answers a request beyond its client's cap that came
	// through a trusted proxy; it should not ask to close the connection,
	// which the proxy shares among its clients (the server still closes it
	// after an answer that left much of a request body unread). Nil
	// answers a plain 429.
	TooManyRequests http.Handler
	// ShutdownTimeout bounds the drain of requests in flight on shutdown.
	ShutdownTimeout time.Duration
	// Registry is served on /metrics; nil serves no metrics.
	Registry *prometheus.Registry
	// Pprof serves Go's profiles under /debug/pprof/ on the admin port.
	Pprof bool
	// Ready reports whether the proxy can route (/readyz); nil is always.
	Ready func() bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Serve serves the proxy on ln and the admin endpoints on adminLn until ctx
// ends, then drains (see the package comment) and returns. It closes both
// listeners.
func Serve(ctx context.Context, cfg Config, ln, adminLn net.Listener) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	group := daemon.NewGroup(log, cfg.ShutdownTimeout)
	handler := cfg.Handler
	if cfg.MaxConnsPerClient > 0 {
		over := cfg.OverLimit
		if over == nil {
			over = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Connection", "close")
				http.Error(w, "too many connections from this client", http.StatusTooManyRequests)
			})
		}
		tooMany := cfg.TooManyRequests
		if tooMany == nil {
			tooMany = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "too many requests in flight from this client", http.StatusTooManyRequests)
			})
		}
		handler = clientLimits(handler, over, tooMany, newPerClient(cfg.MaxConnsPerClient), cfg.TrustedProxies)
		ln = &limitListener{Listener: ln, conns: newPerClient(cfg.MaxConnsPerClient), trusted: cfg.TrustedProxies}
	}
	proxySrv := newHTTPServer(handler, cfg, log)
	if cfg.MaxConnsPerClient > 0 {
		proxySrv.ConnContext = markConn
	}
	admin := daemon.AdminConfig{Pprof: cfg.Pprof}
	if cfg.Registry != nil {
		admin.Gatherer = cfg.Registry
	}
	if cfg.Ready != nil {
		admin.Ready = func() error {
			if !cfg.Ready() {
				return errNotSynced
			}
			return nil
		}
	}
	group.ServeAdmin(admin, adminLn)
	group.Serve("the envd proxy", proxySrv, ln)
	log.InfoContext(ctx, "envd proxy serving", "address", ln.Addr().String(), "admin_address", adminLn.Addr().String(),
		"tls", cfg.TLS != nil, "max_conns_per_client", cfg.MaxConnsPerClient, "trusted_proxies", len(cfg.TrustedProxies), "pprof", cfg.Pprof)
	return group.Wait(ctx)
}

// errNotSynced is /readyz's answer until the proxy can route.
var errNotSynced = errors.New("the fleet inventory has not synced yet")

// newHTTPServer has no read or write timeout: streams are long-lived and
// may be silent for minutes. Only the headers must arrive in time.
func newHTTPServer(h http.Handler, cfg Config, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		Protocols:         new(http.Protocols),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxConcurrentStreams},
	}
	srv.Protocols.SetHTTP1(true)
	if cfg.TLS != nil {
		srv.TLSConfig = cfg.TLS
		srv.Protocols.SetHTTP2(true)
	}
	return srv
}
