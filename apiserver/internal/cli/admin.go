package cli

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// adminShutdownTimeout bounds the drain of the admin listener's requests
// (a scrape, a profile) on shutdown; what is left is cut.
const adminShutdownTimeout = time.Second

// adminHandler serves the operations endpoints: /metrics (reg), /healthz
// (200 while the process serves), /readyz (200 once ready says the fleet
// has synced, else 503), and with enablePprof Go's profiles under
// /debug/pprof/.
func adminHandler(reg *prometheus.Registry, ready func() bool, enablePprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "the fleet inventory has not synced yet, or the server is shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	if enablePprof {
		// Registered here, never on http.DefaultServeMux, which no listener
		// serves.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// adminServer is the admin listener's server. done is closed when it stops
// serving, err then says why; both are nil without a listener.
type adminServer struct {
	srv  *http.Server
	done chan struct{}
	err  error
}

// startAdmin serves h on ln until stop; a nil ln serves nothing.
func startAdmin(ctx context.Context, ln net.Listener, h http.Handler, enablePprof bool, log *slog.Logger) *adminServer {
	a := &adminServer{}
	if ln == nil {
		return a
	}
	// No write timeout: a CPU profile or a trace streams for as long as it
	// was asked to.
	a.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		a.err = a.srv.Serve(ln)
	}()
	log.InfoContext(ctx, "serving the operations endpoints", "admin_listen", ln.Addr().String(), "pprof", enablePprof)
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && enablePprof && !tcp.IP.IsLoopback() {
		log.WarnContext(ctx, "profiles are served beyond this host: --enable-pprof on a --admin-listen that is not loopback",
			"admin_listen", ln.Addr().String())
	}
	return a
}

// stop shuts the server down and waits for it.
func (a *adminServer) stop(ctx context.Context) {
	if a.srv == nil {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminShutdownTimeout)
	defer cancel()
	if err := a.srv.Shutdown(sctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.done
}
