package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
)

// HostConfig describes one simulated host.
type HostConfig struct {
	Sandboxd SandboxdConfig
	// Addr is where its sandboxd listens (host:port), which its inventory
	// names as spec.endpoint.
	Addr string
	// Kube reaches the control plane as the host's own identity (the node
	// user the NodeInventory owner policy checks).
	Kube *rest.Config
	// Publish is the publish cadence (vk-sandbox's --publish-interval and
	// --publish-min-interval).
	Publish publish.Options
	// Writes, if set, counts the host's applies (one may count a fleet's).
	Writes *Writes
	// Log defaults to slog.Default().
	Log *slog.Logger
}

// Host is one simulated host: a Sandboxd served on its own address, and
// vk-sandbox's mirror and publisher of it. Start and Kill may alternate.
type Host struct {
	cfg    HostConfig
	sd     *Sandboxd
	writer publish.Writer
	log    *slog.Logger

	mu      sync.Mutex
	running *run // nil while dead
}

// run is one life of a host, from Start to Kill or Stop.
type run struct {
	srv    *http.Server
	mirror *hostinventory.Host
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewHost returns a host with no sandboxes, not started.
func NewHost(cfg HostConfig) (*Host, error) {
	if err := cfg.Publish.Validate(); err != nil {
		return nil, fmt.Errorf("host %s: %w", cfg.Sandboxd.NodeName, err)
	}
	dyn, err := dynamic.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("host %s: kubernetes client: %w", cfg.Sandboxd.NodeName, err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	var w publish.Writer = publish.NewKubeWriter(dyn, cfg.Publish)
	if cfg.Writes != nil {
		w = countingWriter{Writer: w, w: cfg.Writes}
	}
	return &Host{cfg: cfg, sd: NewSandboxd(cfg.Sandboxd), writer: w, log: log.With("node", cfg.Sandboxd.NodeName)}, nil
}

// Name is the host's node name.
func (h *Host) Name() string { return h.cfg.Sandboxd.NodeName }

// Endpoint is its sandboxd's address (host:port).
func (h *Host) Endpoint() string { return h.cfg.Addr }

// Sandboxd is the host's sandboxd, which churn and seeding change directly.
func (h *Host) Sandboxd() *Sandboxd { return h.sd }

// Start listens on the host's address and serves its sandboxd at once,
// and after delay starts following it (hostinventory's mirror, over a
// Connect client with the node token, as vk-sandbox does) and publishing
// its NodeInventory, until ctx ends or Kill. A fleet spreads its hosts'
// delays over a publish interval, so that their publishes do not come in
// step, as a real fleet's do not.
func (h *Host) Start(ctx context.Context, delay time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.running != nil {
		return fmt.Errorf("host %s is running", h.Name())
	}
	ln, err := net.Listen("tcp", h.cfg.Addr)
	if err != nil {
		return fmt.Errorf("host %s: %w", h.Name(), err)
	}
	srv := &http.Server{
		Handler: h.sd.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(h.log.Handler(), slog.LevelDebug), Protocols: new(http.Protocols),
	}
	// As sandboxd: HTTP/1.1 and h2c.
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	ctx, cancel := context.WithCancel(ctx)
	r := &run{srv: srv, cancel: cancel}
	r.mirror = hostinventory.New(sandboxdapi.NewClients(h.cfg.Sandboxd.Token, nil)(h.cfg.Addr), h.cfg.Addr, hostinventory.Options{})
	applier := publish.New(publish.Config{
		Source: r.mirror, Writer: h.writer, Changes: r.mirror.Changed(), NodeName: h.Name(),
		Options: h.cfg.Publish, Log: h.log.With("component", "publisher"),
	})
	r.wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("simulated sandboxd stopped serving", "error", err)
		}
	})
	r.wg.Go(func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		wg.Go(func() { _ = r.mirror.Run(ctx) })
		wg.Go(func() {
			if err := applier.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				h.log.Error("publisher stopped", "error", err)
			}
		})
		wg.Wait()
	})
	h.running = r
	return nil
}

// Kill ends the host as a kill -9 of its sandboxd and vk-sandbox would:
// its listener and every connection close at once, and its publisher
// stops without another write. Its sandboxes stay, for the next Start.
func (h *Host) Kill() {
	h.mu.Lock()
	r := h.running
	h.running = nil
	h.mu.Unlock()
	if r == nil {
		return
	}
	_ = r.srv.Close()
	h.sd.EndWatches()
	r.cancel()
	r.wg.Wait()
}

// Running reports whether the host runs.
func (h *Host) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.running != nil
}

// Inventory is the host's NodeInventory as its publisher would write it
// now (without publishedAt); it fails while the host is dead or its mirror
// out of sync.
func (h *Host) Inventory() (*v1beta1.NodeInventory, error) {
	h.mu.Lock()
	r := h.running
	h.mu.Unlock()
	if r == nil {
		return nil, fmt.Errorf("host %s is not running", h.Name())
	}
	return r.mirror.Inventory()
}
