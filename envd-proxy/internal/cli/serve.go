package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/envd-proxy/internal/proxy"
	"github.com/skiff-dev/skiff/envd-proxy/internal/route"
	"github.com/skiff-dev/skiff/envd-proxy/internal/server"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

func serveCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Route e2b SDK traffic to the sandboxd of the host that runs each sandbox",
		Long: `Serve the data-plane edge that e2b SDKs reach as E2B_SANDBOX_URL (headers
E2b-Sandbox-Id and E2b-Sandbox-Port) or as <port>-<sandboxID>.<domain>.
Each request goes to the sandboxd of the fresh node whose tag ends the
sandbox ID, which relays it into the sandbox. A sandbox on no fresh node
gets e2b's 502 at once.

With --inventory static the fleet is the --sandboxd hosts, followed over
their Watch streams (no Kubernetes); with --inventory kube it is the
NodeInventory objects, freshness-filtered.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), &o) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func serve(ctx context.Context, o *Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	log, err := o.Log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen on --listen %s: %w", o.Listen, err)
	}
	adminLn, err := net.Listen("tcp", o.AdminListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("listen on --admin-listen %s: %w", o.AdminListen, err)
	}
	return run(ctx, o, ln, adminLn, log)
}

// run serves on the given listeners until ctx ends (or the fleet cannot be
// followed at all), and closes them. o must be valid.
func run(ctx context.Context, o *Options, ln, adminLn net.Listener, log *slog.Logger) (err error) {
	defer func() {
		if err != nil {
			_ = ln.Close()
			_ = adminLn.Close()
		}
	}()
	nodeTokens, err := o.NodeTokens.Load()
	if err != nil {
		return err
	}
	tlsConfig, err := o.serverTLS()
	if err != nil {
		return err
	}
	if o.IdleTimeout < minAdvisedIdleTimeout {
		log.WarnContext(ctx, "--idle-timeout is shorter than e2b's edge; SDK connections may be closed under them",
			"idle_timeout", o.IdleTimeout, "advised", minAdvisedIdleTimeout)
	}
	tokens := route.NewTokens(o.TokenRoutes)
	metrics := proxy.NewMetrics(tokens)

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idxOpts := fleet.Options{RefreshInterval: o.IndexRefresh, OnRefresh: metrics.ObserveRefresh, Logger: log}
	var index *fleet.Index
	var synced func() bool
	switch o.Inventory {
	case inventoryKube:
		cfg, err := restConfig(o.Kubeconfig)
		if err != nil {
			return err
		}
		kf, err := newKubeFleet(cfg, o.Kube)
		if err != nil {
			return err
		}
		index = fleet.New(kf.source, idxOpts)
		synced = index.Synced
		wg.Go(func() {
			wait, err := kf.start(ctx, index.Poke)
			if err != nil {
				cancel(err)
				return
			}
			_ = index.Run(ctx)
			if err := wait(); err != nil {
				log.ErrorContext(ctx, "NodeInventory cache stopped", "error", err)
			}
		})
	default:
		src := inventory.NewStaticSource()
		index = fleet.New(src, idxOpts)
		// A fleet-wide token (Validate): the hosts are followed before
		// their names are known.
		hosts := followHosts(ctx, &wg, o.Sandboxd, sandboxdapi.NewClients(nodeTokens.For(""), &http.Client{}), src)
		synced = func() bool { return index.Synced() && hostsTried(hosts, index) }
		wg.Go(func() { _ = index.Run(ctx) })
	}

	var ready atomic.Bool
	readyFn := func() bool {
		if ready.Load() {
			return true
		}
		if synced() {
			ready.Store(true)
			log.InfoContext(ctx, "fleet inventory synced", "nodes", index.Nodes())
			return true
		}
		return false
	}
	handler := proxy.New(proxy.Config{
		Fleet:           index,
		Ready:           readyFn,
		Tokens:          tokens,
		NodeToken:       nodeTokens.For,
		BodyIdleTimeout: o.BodyIdleTimeout,
		Transport:       proxy.NewTransport(proxy.TransportOptions{}, metrics),
		Metrics:         metrics,
		Logger:          log,
	})
	err = server.Serve(ctx, server.Config{
		Handler:           handler,
		TLS:               tlsConfig,
		IdleTimeout:       o.IdleTimeout,
		MaxConnsPerClient: o.MaxConnsPerClient,
		OverLimit:         http.HandlerFunc(handler.TooManyConnections),
		ShutdownTimeout:   o.ShutdownTimeout,
		Registry:          metrics.Registry,
		Ready:             readyFn,
		Logger:            log,
	}, ln, adminLn)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && err == nil {
		return cause // the fleet could not be followed
	}
	return err
}

// followedHost is one sandboxd of static mode.
type followedHost struct {
	endpoint string
	mirror   *hostinventory.Host
}

// followHosts mirrors each sandboxd at endpoints into src until ctx ends
// (hostinventory's Host and Feed for each), in goroutines that wg waits
// for.
func followHosts(ctx context.Context, wg *sync.WaitGroup, endpoints []string,
	clients func(string) sandboxdv1connect.SandboxdServiceClient, src *inventory.StaticSource) []followedHost {
	hosts := make([]followedHost, 0, len(endpoints))
	for _, addr := range endpoints {
		h := hostinventory.New(clients(addr), addr, hostinventory.Options{})
		hosts = append(hosts, followedHost{endpoint: addr, mirror: h})
		wg.Go(func() { _ = h.Run(ctx) })
		wg.Go(func() { hostinventory.Feed(ctx, h, src, time.Now) })
	}
	return hosts
}

// hostsTried reports whether each host has been followed once: reached and
// in the routing index, or failed. A host that is down must not keep the
// others from serving.
func hostsTried(hosts []followedHost, index *fleet.Index) bool {
	for _, h := range hosts {
		synced, err := h.mirror.Synced()
		switch {
		case synced && index.Seen(h.endpoint):
		case !synced && err != nil:
		default:
			return false
		}
	}
	return true
}

// serverTLS is the listener's TLS configuration: nil without --tls-cert.
func (o *Options) serverTLS() (*tls.Config, error) {
	if o.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert and --tls-key: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}
