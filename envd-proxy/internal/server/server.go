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
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const (
	readHeaderTimeout = 10 * time.Second
	maxHeaderBytes    = 1 << 20
	// maxConcurrentStreams is how many requests one HTTP/2 client
	// connection may have open; the e2b SDKs allow 2,000 in flight.
	maxConcurrentStreams = 1000
	// cutGrace is how long handlers get to return once their requests were
	// cancelled at the end of the shutdown timeout.
	cutGrace = 5 * time.Second
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
	// ShutdownTimeout bounds the drain of requests in flight on shutdown.
	ShutdownTimeout time.Duration
	// Registry is served on /metrics; nil serves no metrics.
	Registry *prometheus.Registry
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
	var draining atomic.Bool
	inflight := &tracker{}
	// Requests derive from base, which is cancelled only when the drain
	// runs out of time: then every proxied request, upgraded ones
	// included, ends.
	base, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()

	handler := cfg.Handler
	if cfg.MaxConnsPerClient > 0 {
		over := cfg.OverLimit
		if over == nil {
			over = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Connection", "close")
				http.Error(w, "too many connections from this client", http.StatusTooManyRequests)
			})
		}
		handler = refuseOverLimit(handler, over)
		ln = &limitListener{Listener: ln, conns: newClientConns(cfg.MaxConnsPerClient)}
	}
	proxySrv := newHTTPServer(inflight.wrap(handler), cfg, log)
	proxySrv.BaseContext = func(net.Listener) context.Context { return base }
	if cfg.MaxConnsPerClient > 0 {
		proxySrv.ConnContext = markOverLimit
	}
	adminSrv := newHTTPServer(adminHandler(cfg, &draining), Config{IdleTimeout: cfg.IdleTimeout}, log)

	errc := make(chan error, 2)
	go func() { errc <- serveOn(proxySrv, ln, cfg.TLS != nil) }()
	go func() { errc <- adminSrv.Serve(adminLn) }()
	log.InfoContext(ctx, "envd proxy serving", "address", ln.Addr().String(), "admin_address", adminLn.Addr().String(),
		"tls", cfg.TLS != nil, "max_conns_per_client", cfg.MaxConnsPerClient)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	draining.Store(true)
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	log.InfoContext(ctx, "envd proxy draining", "open_requests", inflight.count(), "timeout", cfg.ShutdownTimeout)

	// Shutdown stops accepting and waits for connections to go idle, but
	// not for upgraded (hijacked) ones: the tracker waits for every handler.
	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- proxySrv.Shutdown(drainCtx) }()
	drained := inflight.wait(drainCtx) == nil
	if err := <-shutdownErr; err != nil {
		drained = false
	}
	if !drained {
		log.WarnContext(ctx, "shutdown timeout reached: cutting the requests still open", "open_requests", inflight.count())
		cut()
		_ = proxySrv.Close()
		graceCtx, cancelGrace := context.WithTimeout(context.WithoutCancel(ctx), cutGrace)
		_ = inflight.wait(graceCtx)
		cancelGrace()
	}
	adminCtx, cancelAdmin := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancelAdmin()
	if err := adminSrv.Shutdown(adminCtx); err != nil {
		_ = adminSrv.Close()
	}
	log.InfoContext(ctx, "envd proxy stopped", "drained", drained)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return nil
}

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

func serveOn(srv *http.Server, ln net.Listener, useTLS bool) error {
	if useTLS {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}

// adminHandler serves /metrics, /healthz (the process serves) and /readyz
// (it can route, and is not shutting down).
func adminHandler(cfg Config, draining *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	if cfg.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case draining.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case cfg.Ready != nil && !cfg.Ready():
			http.Error(w, "the fleet inventory has not synced yet", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	return mux
}

// tracker counts running handlers, so that a drain can wait for upgraded
// connections, which http.Server.Shutdown does not track.
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (t *tracker) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.add(1)
		defer t.add(-1)
		h.ServeHTTP(w, r)
	})
}

func (t *tracker) add(d int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n += d
	switch {
	case t.n == 0 && t.idle != nil:
		close(t.idle)
		t.idle = nil
	case t.n > 0 && t.idle == nil:
		t.idle = make(chan struct{})
	}
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// wait returns nil once no handler runs, or ctx's error.
func (t *tracker) wait(ctx context.Context) error {
	t.mu.Lock()
	idle := t.idle
	t.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
