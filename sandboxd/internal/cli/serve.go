package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/skiff-dev/skiff/sandboxd/internal/hostlimits"
	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/network"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/gvisor"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/server"
	"github.com/skiff-dev/skiff/sandboxd/internal/service"
	"github.com/skiff-dev/skiff/sandboxd/internal/snapshot"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/shared/daemon"
)

func serveCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the sandbox API, the traffic relay and the admin port",
		Long: `Run the daemon. It re-adopts the sandboxes a previous sandboxd left
(running and paused ones keep their IDs, tokens and deadlines; those that
died meanwhile are cleaned up), then serves until SIGTERM. Sandboxes are not
its children: stopping sandboxd leaves them running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// Run runs the daemon the completed and validated options describe, until
// ctx ends: it sets the host's limits, opens the state directory, sets up
// the network and the runtime, and serves.
func (o *Options) Run(ctx context.Context) error {
	log, err := o.Log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	slog.SetDefault(log) // the relay and libraries log through the default
	if o.Runtime == native.Name {
		// Once, so that no sandbox start copies the binary (see there).
		if err := native.ReexecSealed(); err != nil {
			return err
		}
	}
	// After the re-exec: the process that exports is the one that serves.
	stopTracing, err := daemon.Tracing(ctx, log, "sandboxd")
	if err != nil {
		return err
	}
	defer stopTracing()
	limits, err := hostlimits.Apply(hostlimits.Options{
		MaxSandboxes: o.MaxSandboxes, PidsLimit: o.PidsLimit, PidsReserve: o.PidsReserve, CgroupParent: o.CgroupParent,
	})
	if err != nil {
		return err
	}
	if limits.RaisedFrom != 0 {
		log.Info("raised kernel.pid_max for the sandboxes", "from", limits.RaisedFrom, "to", limits.PidMax)
	}
	log.Info("bounded the processes of all sandboxes together", "pids_max", limits.SandboxPids, "per_sandbox", o.PidsLimit,
		"kernel_pid_max", limits.PidMax, "kernel_threads_max", limits.ThreadsMax, "host_reserve", o.PidsReserve)
	stateDir := o.Global.StateDir
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return err
	}
	// One sandboxd per state directory; sandboxd cleanup checks it too.
	lock, err := lockStateDir(stateDir)
	if err != nil {
		return err
	}
	defer lock.Close()
	st, err := store.Open(filepath.Join(stateDir, "records"))
	if err != nil {
		return err
	}
	reg, err := registry.Open(st, o.Limits())
	if err != nil {
		// Unreadable records were moved aside; the others load.
		log.Error("some sandbox records could not be read", "error", err)
	}
	pool, err := ipam.New(o.SandboxCIDR)
	if err != nil {
		return err
	}
	lib, err := template.OpenLibrary(filepath.Join(stateDir, "templates"))
	if err != nil {
		return err
	}
	nm, err := network.New(o.NetworkOptions())
	if err != nil {
		return err
	}
	if err := nm.Init(ctx); err != nil {
		return err
	}
	defer nm.Close()
	rt, err := o.newRuntime(log)
	if err != nil {
		return err
	}
	// Releases what the runtime holds for itself; sandboxes keep running.
	defer rt.Close()
	snaps, err := snapshot.Open(filepath.Join(stateDir, "snapshots"))
	if err != nil {
		return err
	}
	peers, err := o.peerClient()
	if err != nil {
		return err
	}
	svc, err := service.New(o.ServiceConfig(), service.Deps{
		Peers:     peers,
		Runtime:   rt,
		Network:   networkAdapter{nm},
		Templates: lib,
		Snapshots: snaps,
		Registry:  reg,
		IPAM:      pool,
		LogDir:    filepath.Join(stateDir, "logs"),
		Logger:    log,
	})
	if err != nil {
		return err
	}
	srv, err := server.New(o.ServerConfig(), svc, log)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// peerClient is the client snapshot pulls fetch from other hosts with:
// their certificates chain to --peer-ca, or to the system's roots.
func (o *Options) peerClient() (*http.Client, error) {
	tr := &http.Transport{Proxy: nil, ForceAttemptHTTP2: true, ResponseHeaderTimeout: time.Minute, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	if o.PeerCA != "" {
		pem, err := os.ReadFile(o.PeerCA)
		if err != nil {
			return nil, fmt.Errorf("--peer-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--peer-ca %s: no certificate in it", o.PeerCA)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{Transport: tr}, nil
}

// closingRuntime is a sandbox runtime that holds something of its own to release.
type closingRuntime interface {
	sandboxrt.Runtime
	Close() error
}

func (o *Options) newRuntime(log *slog.Logger) (closingRuntime, error) {
	stateDir := o.Global.StateDir
	switch o.Runtime {
	case native.Name:
		if o.DefaultDiskMiB > 0 {
			if err := native.CheckDisks(); err != nil {
				return nil, err
			}
		}
		opts := native.DefaultOptions(filepath.Join(stateDir, native.Name))
		opts.UIDBase, opts.PidsLimit, opts.CgroupParent, opts.Logger = o.UIDBase, o.PidsLimit, o.CgroupParent, log
		opts.Slots = o.MaxSandboxes
		return native.New(opts)
	case gvisor.Name:
		runsc, err := exec.LookPath(o.Runsc)
		if err != nil {
			return nil, fmt.Errorf("--runsc: %w (build it with make runsc)", err)
		}
		opts := gvisor.DefaultOptions(filepath.Join(stateDir, gvisor.Name), runsc)
		opts.Platform, opts.PidsLimit, opts.CgroupParent, opts.Logger = o.RunscPlatform, o.PidsLimit, o.CgroupParent, log
		return gvisor.New(opts)
	default:
		return nil, fmt.Errorf("--runtime %q: not one of %q", o.Runtime, []string{native.Name, gvisor.Name})
	}
}

// networkAdapter gives the service the namespace path of a set-up network.
type networkAdapter struct{ *network.Manager }

func (a networkAdapter) Setup(ctx context.Context, id string, b ipam.Block, allowInternet bool) (string, error) {
	sb, err := a.Manager.Setup(ctx, id, b, allowInternet)
	if err != nil {
		return "", err
	}
	return sb.NetNS, nil
}
