package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/envd-proxy/internal/proxy"
	"github.com/skiff-dev/skiff/envd-proxy/internal/route"
	"github.com/skiff-dev/skiff/envd-proxy/internal/server"
	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
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
	if err := o.Complete(); err != nil {
		return err
	}
	log, err := daemon.Logger(&o.Log)
	if err != nil {
		return err
	}
	kubeclient.SendLogs(log)
	fleetsource.SendCacheLogs(log)
	stopTracing, err := daemon.Tracing(ctx, log, "sandbox-envd-proxy")
	if err != nil {
		return err
	}
	defer stopTracing()
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen on --listen %s: %w", o.Listen, err)
	}
	adminLn, err := net.Listen("tcp", o.Admin.Listen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("listen on --admin-listen %s: %w", o.Admin.Listen, err)
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
	trustedProxies, err := o.trustedProxies()
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
	idxOpts := fleet.Options{RefreshInterval: o.IndexRefresh, OnRefresh: metrics.ObserveRefresh, GoneAfter: o.GoneNodeGrace, Logger: log}
	var index *fleet.Index
	var synced func() bool
	if o.IsKube() {
		cfg, err := kubeclient.RESTConfig(o.Kubeconfig, "sandbox-envd-proxy")
		if err != nil {
			return err
		}
		kf, err := openKubeFleet(ctx, cfg, o.Stale)
		if err != nil {
			return err
		}
		index = fleet.New(fleet.ListerFunc(kf.Source.ListNodesShared), idxOpts) // the index only reads
		if err := kf.OnInventoryChange(ctx, index.Poke); err != nil {
			return err
		}
		synced = index.Synced
		wg.Go(func() {
			if err := kf.Start(ctx, 0); err != nil {
				cancel(err)
				return
			}
			_ = index.Run(ctx)
			if err := kf.Stop(); err != nil {
				log.ErrorContext(ctx, "NodeInventory cache stopped", "error", err)
			}
		})
	} else {
		// A fleet-wide token (Validate): the hosts are followed before
		// their names are known.
		hosts := fleetsource.Follow(ctx, &wg, o.Sandboxd, sandboxdapi.NewClients(nodeTokens.For(""), &http.Client{}))
		index = fleet.New(hosts.Source, idxOpts)
		synced = func() bool { return index.Synced() && hosts.Tried(index.Seen) }
		wg.Go(func() { _ = index.Run(ctx) })
	}
	readyFn := fleetsource.Gate(synced, func() { log.InfoContext(ctx, "fleet inventory synced", "nodes", index.Nodes()) })
	// The line above is written when the fleet syncs, not at the first
	// readiness probe after it.
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for !readyFn() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	handler := proxy.New(proxy.Config{
		Fleet:           index,
		Ready:           readyFn,
		Tokens:          tokens,
		NodeToken:       nodeTokens.For,
		BodyIdleTimeout: o.BodyIdleTimeout,
		TrustedProxies:  trustedProxies,
		Transport:       proxy.NewTransport(proxy.TransportOptions{}, metrics),
		Metrics:         metrics,
		Logger:          log,
	})
	index.OnGone(handler.NodesGone)
	err = server.Serve(ctx, server.Config{
		Handler:           handler,
		TLS:               tlsConfig,
		IdleTimeout:       o.IdleTimeout,
		MaxConnsPerClient: o.MaxConnsPerClient,
		OverLimit:         http.HandlerFunc(handler.TooManyConnections),
		TrustedProxies:    trustedProxies,
		TooManyRequests:   http.HandlerFunc(handler.TooManyRequests),
		ShutdownTimeout:   o.Shutdown.Timeout,
		Registry:          metrics.Registry,
		Pprof:             o.Admin.EnablePprof,
		Ready:             readyFn,
		Logger:            log,
	}, ln, adminLn)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && err == nil {
		return cause // the fleet could not be followed
	}
	return err
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
