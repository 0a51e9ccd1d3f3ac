package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/skiff-dev/skiff/sandboxd/internal/relay"
	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

const (
	readHeaderTimeout = 10 * time.Second
	// idleTimeout outlasts the SDKs' and proxies' keep-alives (envd's
	// streams send one every 90 s; e2b's edge idles out at 610 s).
	idleTimeout    = 620 * time.Second
	maxHeaderBytes = 1 << 20
	// compressMinBytes is the smallest Connect message sent gzipped.
	compressMinBytes = 64 << 10
)

// Handler is the API listener's handler: requests that name a sandbox
// (E2b-Sandbox-Id / E2b-Sandbox-Port, or a `<port>-<id>.` host) go to the
// relay, everything else to the Connect service, all behind the token
// check.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(s,
		connect.WithInterceptors(rpcCounter{s.metrics}),
		// Connect gzips every message a client accepts gzip for (its
		// default threshold is 0 bytes): resetting the compressor cost
		// more than the rest of a Get or a Claim together. Only messages
		// big enough to gain from it (a long List) are compressed.
		connect.WithCompressMinBytes(compressMinBytes)))
	rel := relay.New(s)
	route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isRelayed(r) {
			rel.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
	return s.authenticate(route, isRelayed)
}

// isRelayed reports whether a request names a sandbox (well or badly: the
// relay answers a bad target itself).
func isRelayed(r *http.Request) bool {
	_, err := routing.Parse(r)
	return !errors.Is(err, routing.ErrNoTarget)
}

// AdminHandler serves /healthz and /metrics.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", s.healthz)
	return mux
}

// healthz is 200 "ok" once the records are re-adopted, while the registry
// answers and the log directory is there.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if !s.recovered.Load() {
		http.Error(w, "recovering sandboxes", http.StatusServiceUnavailable)
		return
	}
	_ = s.reg.Usage() // hangs, and fails the probe, if the registry is stuck
	if _, err := os.Stat(s.logDir); err != nil {
		http.Error(w, "state directory: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// Run listens on --listen and --admin-listen and serves (Serve).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("listen on --listen %s: %w", s.opts.Listen, err)
	}
	adminLn, err := net.Listen("tcp", s.opts.AdminListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("listen on --admin-listen %s: %w", s.opts.AdminListen, err)
	}
	return s.Serve(ctx, ln, adminLn)
}

// Serve serves the admin endpoints at once, re-adopts the recorded
// sandboxes (Recover), then serves the API and starts the metrics sampler,
// until ctx ends. Shutdown stops the listeners, ends Watch streams and
// disarms the deadlines, and leaves every sandbox running: they are not
// sandboxd's children, and the next start re-adopts them.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	admin := s.httpServer(s.AdminHandler(), false)
	api := s.httpServer(s.Handler(), s.tlsConfig != nil)
	errc := make(chan error, 2)
	go func() { errc <- serveOn(admin, adminLn, false) }()

	if err := s.Recover(ctx); err != nil {
		s.log.ErrorContext(ctx, "recover sandboxes", "error", err)
	}
	var wg sync.WaitGroup
	samplerCtx, stopSampler := context.WithCancel(ctx)
	wg.Go(func() { s.samples.Run(samplerCtx, s.opts.MetricsInterval) })
	go func() { errc <- serveOn(api, ln, s.tlsConfig != nil) }()
	s.log.InfoContext(ctx, "sandboxd serving", "address", ln.Addr().String(), "admin_address", adminLn.Addr().String(),
		"node", s.opts.NodeName, "tag", string(s.tag), "runtime", s.rt.Name(), "envd_version", s.envdVersion,
		"tls", s.tlsConfig != nil, "token", s.token != nil)
	if s.token == nil && s.tlsConfig == nil {
		s.log.WarnContext(ctx, "serving WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who reaches this port controls every sandbox")
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	close(s.stopping)
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
	defer cancel()
	for _, srv := range []*http.Server{api, admin} {
		if err := srv.Shutdown(shutdownCtx); err != nil {
			_ = srv.Close() // relayed streams do not end by themselves
		}
	}
	stopSampler()
	wg.Wait()
	s.stopExits()
	s.exitWG.Wait()
	s.deadlines.Stop()
	// Prepared sandboxes are not sandboxes: they go (a sandboxd killed
	// instead leaves them to the next one's sweep of orphans).
	if s.prepared != nil {
		s.prepared.Close(shutdownCtx)
	}
	s.log.InfoContext(ctx, "sandboxd stopped; sandboxes keep running")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return nil
}

// httpServer serves HTTP/1.1 and HTTP/2 (h2c without TLS, for Connect's
// streams and gRPC clients). It has no write timeout: Watch and relayed
// streams are long.
func (s *Server) httpServer(h http.Handler, useTLS bool) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		Protocols:         new(http.Protocols),
	}
	srv.Protocols.SetHTTP1(true)
	if useTLS {
		srv.TLSConfig = s.tlsConfig
		srv.Protocols.SetHTTP2(true)
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	return srv
}

func serveOn(srv *http.Server, ln net.Listener, useTLS bool) error {
	if useTLS {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}
