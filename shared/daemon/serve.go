package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
)

const (
	// cutGrace is how long handlers get to return once their requests were
	// cancelled at the end of the shutdown timeout.
	cutGrace = 5 * time.Second
	// adminShutdownTimeout bounds the drain of the operations endpoints
	// (a scrape, a profile), which stop last; what is left is cut.
	adminShutdownTimeout = time.Second
)

// ErrShuttingDown is what /readyz says while a Group drains.
var ErrShuttingDown = errors.New("shutting down")

// ShutdownOptions is --shutdown-timeout.
type ShutdownOptions struct {
	// Timeout bounds the drain of requests in flight on SIGTERM or SIGINT;
	// what is left then is cut.
	Timeout time.Duration
}

// AddFlags registers --shutdown-timeout, defaulting to o's value; after
// ends the help with what else happens on shutdown (may be empty).
func (o *ShutdownOptions) AddFlags(fs *pflag.FlagSet, after string) {
	help := "On SIGTERM or SIGINT, how long requests, streams and upgraded connections in flight may take to finish before they are cut; 0 cuts them at once."
	if after != "" {
		help += " " + after
	}
	fs.DurationVar(&o.Timeout, "shutdown-timeout", o.Timeout, help)
}

// Validate refuses a negative timeout.
func (o *ShutdownOptions) Validate() error {
	if o.Timeout < 0 {
		return fmt.Errorf("--shutdown-timeout must not be negative, got %s", o.Timeout)
	}
	return nil
}

// A Group serves a binary's listeners and stops them together. Servers
// join it as the binary comes up (the operations endpoints first, so that
// /healthz answers while the rest starts); Wait returns when the context
// ends or any server fails, after the drain: /readyz turns 503, the
// servers stop accepting, requests and streams in flight (upgraded
// connections too) get the shutdown timeout to finish, then their
// contexts are cancelled and their connections closed. The operations
// endpoints stop last.
type Group struct {
	log     *slog.Logger
	timeout time.Duration

	draining atomic.Bool
	inflight tracker
	// base is the requests' context, cancelled only when the drain runs
	// out of time.
	base context.Context
	cut  context.CancelFunc

	mu      sync.Mutex
	servers []*served
	runners []*runner
	failed  chan *served // the first server that stopped by itself
}

// runner is a server that serves itself (Group.Run).
type runner struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

type served struct {
	name  string
	srv   *http.Server
	admin bool
	err   error
}

// NewGroup returns a Group whose drain takes at most timeout.
func NewGroup(log *slog.Logger, timeout time.Duration) *Group {
	base, cut := context.WithCancel(context.Background())
	return &Group{log: log, timeout: timeout, base: base, cut: cut, failed: make(chan *served, 1)}
}

// Serve serves srv on ln (with TLS when srv.TLSConfig is set) until the
// drain; name says what it is in errors and logs ("the e2b API").
func (g *Group) Serve(name string, srv *http.Server, ln net.Listener) {
	srv.Handler = g.inflight.wrap(srv.Handler)
	if srv.BaseContext == nil {
		srv.BaseContext = func(net.Listener) context.Context { return g.base }
	}
	g.start(&served{name: name, srv: srv}, ln)
}

// ServeAdmin serves the operations endpoints of cfg on ln (AdminHandler,
// with /readyz 503 during the drain); they stop after the other servers.
// Profiles served beyond this host are warned of.
func (g *Group) ServeAdmin(cfg AdminConfig, ln net.Listener) {
	if cfg.Pprof {
		warnPprofExposed(g.log, ln)
	}
	srv := NewAdminServer(g.adminHandler(cfg), g.log)
	g.start(&served{name: "the operations endpoints", srv: srv, admin: true}, ln)
}

func (g *Group) start(s *served, ln net.Listener) {
	g.mu.Lock()
	g.servers = append(g.servers, s)
	g.mu.Unlock()
	go func() {
		var err error
		if s.srv.TLSConfig != nil {
			err = s.srv.ServeTLS(ln, "", "")
		} else {
			err = s.srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return
		}
		s.err = err
		select {
		case g.failed <- s:
		default:
		}
	}()
}

// Run runs a server that owns its listener and its own shutdown (such as
// k8s.io/apiserver's): run serves until its context ends, then shuts down
// and returns. Its context ends when the drain begins, and the drain waits
// for run to return, at most the drain's timeout; run returning before
// the drain, error or not, fails the Group as a stopped server does.
func (g *Group) Run(name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{name: name, cancel: cancel, done: make(chan struct{})}
	g.mu.Lock()
	g.runners = append(g.runners, r)
	g.mu.Unlock()
	go func() {
		defer close(r.done)
		err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("stopped by itself")
		}
		select {
		case g.failed <- &served{name: name, err: err}:
		default:
		}
	}()
}

// Draining reports whether the drain has begun.
func (g *Group) Draining() bool { return g.draining.Load() }

// adminHandler is AdminHandler(cfg) whose /readyz is 503 during the drain.
func (g *Group) adminHandler(cfg AdminConfig) http.Handler {
	ready := cfg.Ready
	cfg.Ready = func() error {
		if g.Draining() {
			return ErrShuttingDown
		}
		if ready != nil {
			return ready()
		}
		return nil
	}
	return AdminHandler(cfg)
}

// Wait serves until ctx ends or a server stops by itself, then drains and
// returns: nil after a signal, the failed server's error otherwise.
func (g *Group) Wait(ctx context.Context) error {
	var failed *served
	select {
	case <-ctx.Done():
	case failed = <-g.failed:
	}
	g.drain()
	if failed != nil {
		return fmt.Errorf("serve %s: %w", failed.name, failed.err)
	}
	return nil
}

// Close stops every server at once, for a binary that fails before Wait.
func (g *Group) Close() {
	g.draining.Store(true)
	g.cut()
	for _, s := range g.snapshot() {
		_ = s.srv.Close()
	}
	for _, r := range g.snapshotRunners() {
		r.cancel()
	}
}

func (g *Group) snapshotRunners() []*runner {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*runner(nil), g.runners...)
}

func (g *Group) snapshot() []*served {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*served(nil), g.servers...)
}

func (g *Group) drain() {
	g.draining.Store(true)
	servers := g.snapshot()
	g.log.Info("draining", "open_requests", g.inflight.count(), "timeout", g.timeout)
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()

	// Shutdown stops accepting and waits for connections to go idle, but
	// not for upgraded (hijacked) ones: the tracker waits for every handler.
	var shutdowns sync.WaitGroup
	var shutdownFailed atomic.Bool
	for _, r := range g.snapshotRunners() {
		r.cancel()
		shutdowns.Go(func() {
			select {
			case <-r.done:
			case <-ctx.Done():
				g.log.Warn("shutdown timeout reached: not waiting for a server any longer", "server", r.name)
				shutdownFailed.Store(true)
			}
		})
	}
	for _, s := range servers {
		if !s.admin {
			shutdowns.Go(func() {
				if err := s.srv.Shutdown(ctx); err != nil {
					shutdownFailed.Store(true)
				}
			})
		}
	}
	drained := g.inflight.wait(ctx) == nil
	shutdowns.Wait()
	if shutdownFailed.Load() {
		drained = false
	}
	if !drained {
		g.log.Warn("shutdown timeout reached: cutting the requests still open", "open_requests", g.inflight.count())
		g.cut()
		for _, s := range servers {
			if !s.admin {
				_ = s.srv.Close()
			}
		}
		grace, cancelGrace := context.WithTimeout(context.Background(), cutGrace)
		_ = g.inflight.wait(grace)
		cancelGrace()
	}
	g.cut()
	adminCtx, cancelAdmin := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancelAdmin()
	for _, s := range servers {
		if s.admin {
			if err := s.srv.Shutdown(adminCtx); err != nil {
				_ = s.srv.Close()
			}
		}
	}
	g.log.Info("stopped serving", "drained", drained)
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
