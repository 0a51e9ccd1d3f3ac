package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/service"
	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	"github.com/skiff-dev/skiff/shared/tracing"
)

const (
	readHeaderTimeout = 10 * time.Second
	// idleTimeout outlasts the SDKs' and proxies' keep-alives (envd's
	// streams send one every 90 s; e2b's edge idles out at 610 s).
	idleTimeout    = 620 * time.Second
	maxHeaderBytes = 1 << 20
)

// Handler is the API listener's handler: the service's, behind the token
// check. With tracing on (tracing.Enabled) every request but a Watch is a
// server span in the trace its caller sent: an RPC's named by the RPC
// (sandboxdapi.SpanName), a relayed request's "relay".
//
// Other hosts fetch snapshots under service.ExportPrefix with a pull
// ticket for each instead of the token (see checkTicket).
func (s *Server) Handler() http.Handler {
	api := tracing.Handler(s.authenticate(s.svc.Handler(), service.Relayed), spanName, sandboxdapi.Traced)
	export := s.svc.ExportHandler(s.checkTicket)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, service.ExportPrefix) && !service.Relayed(r) {
			export.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// checkTicket accepts a pull ticket made with this host's token
// (nodetoken.PullTicket); a host without a token accepts none.
func (s *Server) checkTicket(snapshot, ticket string) error {
	if s.token == nil {
		return errors.New("this sandboxd has no token (--auth-token-file) to check pull tickets with")
	}
	return nodetoken.CheckPullTicket(string(s.token), snapshot, ticket, time.Now())
}

// spanName is the name of a request's server span.
func spanName(r *http.Request) string {
	if service.Relayed(r) {
		return "relay"
	}
	return sandboxdapi.SpanName(r)
}

// Listen opens the sockets of cfg's --listen and --admin-listen, for
// Serve. sandboxd opens them before any socket of its own on a port the
// kernel picks (the egress filters'), which could otherwise take a
// --listen port in the kernel's ephemeral range: it did, in a test that
// gives sandboxd a port found free a moment before.
func Listen(cfg Config) (ln, adminLn net.Listener, err error) {
	ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on --listen %s: %w", cfg.Listen, err)
	}
	adminLn, err = net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		_ = ln.Close()
		return nil, nil, fmt.Errorf("listen on --admin-listen %s: %w", cfg.Admin.Listen, err)
	}
	return ln, adminLn, nil
}

// Serve serves the admin endpoints at once, re-adopts the recorded
// sandboxes (service.Recover), then serves the API and runs the service,
// until ctx ends. Shutdown ends Watch streams, drains the listeners
// (daemon.Group) and closes the service, which leaves every sandbox
// running: they are not sandboxd's children, and the next start re-adopts
// them.
func (s *Server) Serve(ctx context.Context, ln, adminLn net.Listener) error {
	group := daemon.NewGroup(s.log, s.cfg.ShutdownTimeout)
	group.ServeAdmin(daemon.AdminConfig{
		Gatherer: s.metrics,
		Healthy:  s.svc.Healthy,
		Pprof:    s.cfg.Admin.EnablePprof,
	}, adminLn)

	if err := s.svc.Recover(ctx); err != nil {
		s.log.ErrorContext(ctx, "recover sandboxes", "error", err)
	}
	var wg sync.WaitGroup
	runCtx, stopRun := context.WithCancel(ctx)
	wg.Go(func() { s.svc.Run(runCtx) })
	api := s.httpServer(s.Handler(), s.tlsConfig != nil)
	// Watch streams end at the drain's start; relayed streams get its time.
	api.RegisterOnShutdown(s.svc.StopWatches)
	group.Serve("the sandboxd API", api, ln)
	attrs := append([]any{"address", ln.Addr().String(), "admin_address", adminLn.Addr().String()}, s.svc.LogAttrs()...)
	s.log.InfoContext(ctx, "sandboxd serving", append(attrs, "tls", s.tlsConfig != nil, "token", s.token != nil)...)
	if s.token == nil && s.tlsConfig == nil {
		s.log.WarnContext(ctx, "serving WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who reaches this port controls every sandbox")
	}

	serveErr := group.Wait(ctx)
	s.svc.StopWatches()
	stopRun()
	wg.Wait()
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	s.svc.Close(closeCtx)
	s.log.InfoContext(ctx, "sandboxd stopped; sandboxes keep running")
	return serveErr
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
