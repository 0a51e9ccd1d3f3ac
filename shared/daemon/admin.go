package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
)

// AdminOptions are --admin-listen and --enable-pprof.
type AdminOptions struct {
	// Listen is the operations endpoints' address; empty turns them off
	// where the binary allows it (Validate's optional).
	Listen string
	// EnablePprof serves Go's profiles under /debug/pprof/ on Listen.
	EnablePprof bool
}

// AddFlags registers --admin-listen and --enable-pprof, defaulting to o's
// values. optional says whether an empty --admin-listen may turn the
// endpoints off.
func (o *AdminOptions) AddFlags(fs *pflag.FlagSet, optional bool) {
	help := "Address of the operations endpoints: /metrics (Prometheus), /healthz, /readyz (503 while not ready for traffic, and on shutdown) " +
		"and, with --enable-pprof, /debug/pprof/; it must differ from the binary's other listen addresses."
	pprof := "Serve Go's profiles (net/http/pprof) under /debug/pprof/ on --admin-listen, never on the binary's other listeners."
	if optional {
		help += " Empty turns them off."
		pprof += " Needs --admin-listen."
	}
	fs.StringVar(&o.Listen, "admin-listen", o.Listen, help)
	fs.BoolVar(&o.EnablePprof, "enable-pprof", o.EnablePprof, pprof)
}

// Validate reports what cannot work: a --admin-listen that is not host:port
// (or empty when not optional), one equal to another listener's address
// (others: flag name → address), pprof without a listener.
func (o *AdminOptions) Validate(optional bool, others map[string]string) error {
	if o.Listen == "" {
		switch {
		case !optional:
			return errors.New("--admin-listen is required")
		case o.EnablePprof:
			return errors.New("--enable-pprof needs --admin-listen: profiles are served on the admin listener only")
		}
		return nil
	}
	_, port, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return fmt.Errorf("--admin-listen %q: want host:port: %w", o.Listen, err)
	}
	for flag, addr := range others {
		if addr == o.Listen && port != "0" {
			return fmt.Errorf("--admin-listen %q: must differ from %s", o.Listen, flag)
		}
	}
	return nil
}

// AdminConfig is what the operations endpoints serve.
type AdminConfig struct {
	// Gatherer is served on /metrics; nil serves no /metrics.
	Gatherer prometheus.Gatherer
	// Healthy says why the process is not healthy (/healthz 503); nil, or
	// a nil answer, is 200.
	Healthy func() error
	// Ready says why the process is not ready for traffic (/readyz 503);
	// nil, or a nil answer, is 200. A Group's drain makes it 503 too, when
	// the handler comes from Group.AdminHandler.
	Ready func() error
	// Pprof serves Go's profiles under /debug/pprof/.
	Pprof bool
}

// AdminHandler serves the operations endpoints of cfg.
func AdminHandler(cfg AdminConfig) http.Handler {
	mux := http.NewServeMux()
	if cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", check(cfg.Healthy))
	mux.HandleFunc("GET /readyz", check(cfg.Ready))
	if cfg.Pprof {
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

func check(why func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if why != nil {
			if err := why(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	}
}

// NewAdminServer is the http.Server of the operations endpoints. It has no
// write timeout: a CPU profile or a trace streams for as long as it was
// asked to.
func NewAdminServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// warnPprofExposed logs a warning when profiles are served on an address
// beyond this host.
func warnPprofExposed(log *slog.Logger, ln net.Listener) {
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("profiles are served beyond this host: --enable-pprof on a --admin-listen that is not loopback",
			"admin_listen", ln.Addr().String())
	}
}

// AddHelp ends the help of the flag name, which a shared option group
// registered in fs, with what holds for the binary that registers it.
func AddHelp(fs *pflag.FlagSet, name, more string) {
	fs.Lookup(name).Usage += " " + more
}
