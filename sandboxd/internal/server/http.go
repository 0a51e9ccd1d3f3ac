package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/skiff-dev/skiff/sandboxd/internal/service"
)

const (
	readHeaderTimeout = 10 * time.Second
	// idleTimeout outlasts the SDKs' and proxies' keep-alives (envd's
	// streams send one every 90 s; e2b's edge idles out at 610 s).
	idleTimeout    = 620 * time.Second
	maxHeaderBytes = 1 << 20
)

// Handler is the API listener's handler: the service's, behind the token
// check.
func (s *Server) Handler() http.Handler {
	return s.authenticate(s.svc.Handler(), service.Relayed)
}

// AdminHandler serves /healthz and /metrics.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", s.healthz)
	return mux
}

// healthz is 200 "ok" while the service is healthy (service.Healthy).
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if err := s.svc.Healthy(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// Run listens on --listen and --admin-listen and serves (Serve).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on --listen %s: %w", s.cfg.Listen, err)
	}
	adminLn, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("listen on --admin-listen %s: %w", s.cfg.AdminListen, err)
	}
	return s.Serve(ctx, ln, adminLn)
}

// Serve serves the admin endpoints at once, re-adopts the recorded
// sandboxes (service.Recover), then serves the API and runs the service,
// until ctx ends. Shutdown ends Watch streams, stops the listeners and
// closes the service, which leaves every sandbox running: they are not
// sandboxd's children, and the next start re-adopts them.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	admin := s.httpServer(s.AdminHandler(), false)
	api := s.httpServer(s.Handler(), s.tlsConfig != nil)
	errc := make(chan error, 2)
	go func() { errc <- serveOn(admin, adminLn, false) }()

	if err := s.svc.Recover(ctx); err != nil {
		s.log.ErrorContext(ctx, "recover sandboxes", "error", err)
	}
	var wg sync.WaitGroup
	runCtx, stopRun := context.WithCancel(ctx)
	wg.Go(func() { s.svc.Run(runCtx) })
	go func() { errc <- serveOn(api, ln, s.tlsConfig != nil) }()
	attrs := append([]any{"address", ln.Addr().String(), "admin_address", adminLn.Addr().String()}, s.svc.LogAttrs()...)
	s.log.InfoContext(ctx, "sandboxd serving", append(attrs, "tls", s.tlsConfig != nil, "token", s.token != nil)...)
	if s.token == nil && s.tlsConfig == nil {
		s.log.WarnContext(ctx, "serving WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who reaches this port controls every sandbox")
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.svc.StopWatches()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	for _, srv := range []*http.Server{api, admin} {
		if err := srv.Shutdown(shutdownCtx); err != nil {
			_ = srv.Close() // relayed streams do not end by themselves
		}
	}
	stopRun()
	wg.Wait()
	s.svc.Close(shutdownCtx)
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
