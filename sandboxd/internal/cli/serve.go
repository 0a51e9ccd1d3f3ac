package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/egressproxy"
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
	"github.com/skiff-dev/skiff/sandboxd/internal/volume"
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

// defaultGCPercent is sandboxd's GOGC when the environment sets none.
const defaultGCPercent = 400

// Run runs the daemon the completed and validated options describe, until
// ctx ends: it sets the host's limits, opens the state directory, sets up
// the network and the runtime, and serves.
func (o *Options) Run(ctx context.Context) error {
	log, err := o.Log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	slog.SetDefault(log) // the relay and libraries log through the default
	if os.Getenv("GOGC") == "" {
		// sandboxd's live heap is small and every sandbox's start and end
		// allocate: at Go's default (100) its collector was 6% of its CPU
		// at 40 lifecycles a second. GOGC, when set, decides instead.
		debug.SetGCPercent(defaultGCPercent)
	}
	if o.Runtime == native.Name && o.InitBinary == OwnBinary {
		// Once, so that no sandbox start copies the binary (see there).
		// With sandboxd-init, libcontainer never copies this one.
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
	if limits.NeighMax == 0 {
		log.Warn("not in the host's network namespace: cannot check the kernel's IPv4 neighbour table bound for the sandboxes",
			"sysctl", "net.ipv4.neigh.default.gc_thresh3", "need", limits.NeighNeed)
	}
	if limits.NeighRaisedFrom != 0 {
		log.Info("raised the kernel's IPv4 neighbour table bound for the sandboxes", "sysctl", "net.ipv4.neigh.default.gc_thresh3",
			"from", limits.NeighRaisedFrom, "to", limits.NeighMax)
	}
	if o.CgroupFavorDynmods {
		// A start waits longer without it, and works: no failure here
		// keeps sandboxd from starting.
		d, err := hostlimits.FavorDynmods()
		const why = "moving each sandbox into its cgroups may wait for an RCU grace period (5 to 17 ms a start)"
		switch {
		case err != nil:
			log.Warn("could not set the cgroup2 option: "+why, "option", hostlimits.DynmodsOption, "error", err)
		case d.Mountpoint == "":
			log.Warn("no cgroup2 mount to set the option through: "+why, "option", hostlimits.DynmodsOption)
		case d.Unsupported:
			log.Warn("the kernel has no such cgroup2 option (Linux 6.0 or later has it): "+why, "option", hostlimits.DynmodsOption)
		case d.Already:
		case !d.Set:
			log.Warn("the kernel took the cgroup2 option but did not apply it (sandboxd outside the host's cgroup namespace?): "+why,
				"option", hostlimits.DynmodsOption, "mountpoint", d.Mountpoint)
		default:
			log.Info("set the cgroup2 option so that moving sandboxes into their cgroups does not wait", "option", hostlimits.DynmodsOption, "mountpoint", d.Mountpoint)
		}
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
	// The API's sockets before the egress filters', whose ports the
	// kernel may pick (server.Listen).
	ln, adminLn, err := server.Listen(o.ServerConfig())
	if err != nil {
		return err
	}
	defer ln.Close()
	defer adminLn.Close()
	fl, err := listenEgress(o.EgressProxyPort, o.DNSFilterPort)
	if err != nil {
		return err
	}
	defer fl.close()
	netOpts := o.NetworkOptions()
	netOpts.EgressProxyPort, netOpts.DNSFilterPort = fl.proxyPort(), fl.dnsPort()
	nm, err := network.New(netOpts)
	if err != nil {
		return err
	}
	if err := nm.Init(ctx); errors.Is(err, network.ErrNetworksLost) {
		// Their sandboxes are found at recovery; torn down (killed, or
		// at their deadline), they lose nothing more.
		log.Warn("sandboxes lost their network: the router namespace's file was unmounted while they ran", "error", err)
	} else if err != nil {
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
	vols, err := o.openVolumes(stateDir)
	if err != nil {
		return err
	}
	peers, err := o.peerClient()
	if err != nil {
		return err
	}
	egressSandboxes := egressproxy.NewSandboxes()
	fl.serve(ctx, egressproxy.Options{Sandboxes: egressSandboxes, Permitted: nm.Permitted, Resolvers: nm.Resolvers, TeamShare: o.EgressTeamShare, Logger: log})
	svc, err := service.New(o.ServiceConfig(), service.Deps{
		Peers:     peers,
		Egress:    egressSandboxes,
		Runtime:   rt,
		Network:   networkAdapter{nm},
		Templates: lib,
		Snapshots: snaps,
		Volumes:   vols,
		Registry:  reg,
		IPAM:      pool,
		LogDir:    filepath.Join(stateDir, "logs"),
		StateDir:  stateDir,
		Logger:    log,
	})
	if err != nil {
		return err
	}
	srv, err := server.New(o.ServerConfig(), svc, log)
	if err != nil {
		return err
	}
	return srv.Serve(ctx, ln, adminLn)
}

// filterListeners are the egress proxy's and DNS filter's sockets, and
// the filters that serve them.
type filterListeners struct {
	proxy  net.Listener
	dnsUDP net.PacketConn
	dnsTCP net.Listener

	stop    context.CancelFunc // ends the filters; nil until serve
	stopped sync.WaitGroup     // the filters' goroutines
}

// listenEgress opens the egress filters' sockets on the host's loopback
// (network.FilterAddr, where the sandboxes' redirected traffic goes), each
// port 0 being a free one.
func listenEgress(proxyPort, dnsPort uint16) (*filterListeners, error) {
	fl := &filterListeners{}
	at := func(port uint16) string { return netip.AddrPortFrom(network.FilterAddr, port).String() }
	var err error
	if fl.proxy, err = net.Listen("tcp4", at(proxyPort)); err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	// The DNS filter takes UDP and TCP on one port: a free UDP one may be
	// taken for TCP, so try a few.
	for attempt := 0; ; attempt++ {
		if fl.dnsUDP, err = net.ListenPacket("udp4", at(dnsPort)); err != nil {
			fl.close()
			return nil, fmt.Errorf("DNS filter: %w", err)
		}
		port := uint16(fl.dnsUDP.LocalAddr().(*net.UDPAddr).Port) //nolint:gosec // a port
		if fl.dnsTCP, err = net.Listen("tcp4", at(port)); err == nil {
			return fl, nil
		}
		_ = fl.dnsUDP.Close()
		fl.dnsUDP = nil
		if dnsPort != 0 || attempt == 20 {
			fl.close()
			return nil, fmt.Errorf("DNS filter: %w", err)
		}
	}
}

func (fl *filterListeners) proxyPort() uint16 { return uint16(fl.proxy.Addr().(*net.TCPAddr).Port) } //nolint:gosec // a port
func (fl *filterListeners) dnsPort() uint16 {
	return uint16(fl.dnsUDP.LocalAddr().(*net.UDPAddr).Port) //nolint:gosec // a port
}

// serve runs the egress proxy and the DNS filter until ctx ends or close
// is called. A filter that stops before is an error.
func (fl *filterListeners) serve(ctx context.Context, o egressproxy.Options) {
	ctx, fl.stop = context.WithCancel(ctx)
	proxy, dns := egressproxy.NewProxy(o), egressproxy.NewDNS(o)
	for name, run := range map[string]func() error{
		"egress proxy":     func() error { return proxy.Serve(ctx, fl.proxy) },
		"DNS filter (UDP)": func() error { return dns.ServeUDP(ctx, fl.dnsUDP) },
		"DNS filter (TCP)": func() error { return dns.ServeTCP(ctx, fl.dnsTCP) },
	} {
		fl.stopped.Go(func() {
			if err := run(); err != nil {
				o.Logger.Error("egress filter stopped", "server", name, "error", err)
			}
		})
	}
}

// close stops the filters, then closes their sockets and waits for them.
// The filters stop first: a filter whose socket closes while its context
// lives takes it for a failure, and sandboxd's start that failed after
// serve (a bad --envd) logged three "egress filter stopped … use of closed
// network connection" errors above its real one.
func (fl *filterListeners) close() {
	if fl.stop != nil {
		fl.stop()
	}
	defer fl.stopped.Wait()
	for _, c := range []io.Closer{fl.proxy, fl.dnsUDP, fl.dnsTCP} {
		if c != nil {
			_ = c.Close()
		}
	}
}

// openVolumes opens the volume store (--volume-dir, --volume-shared,
// --volume-size).
func (o *Options) openVolumes(stateDir string) (*volume.Store, error) {
	dir := o.VolumeDir
	if dir == "" {
		dir = filepath.Join(stateDir, "volumes")
	}
	if o.VolumeSizeMiB > 0 {
		if err := diskimage.Check("volumes"); err != nil {
			return nil, fmt.Errorf("%w; or give --volume-size 0 to keep volumes as directories, unlimited", err)
		}
	}
	vs, err := volume.Open(volume.Options{
		Dir: dir, MountDir: filepath.Join(o.RunDir, "volumes"), Node: o.NodeName,
		SizeMiB: o.VolumeSizeMiB, Shared: o.VolumeShared,
	})
	if err != nil {
		return nil, fmt.Errorf("--volume-dir %s: %w", dir, err)
	}
	return vs, nil
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
		opts.RunDir = filepath.Join(o.RunDir, native.Name)
		opts.UIDBase, opts.PidsLimit, opts.CgroupParent, opts.Logger = o.UIDBase, o.PidsLimit, o.CgroupParent, log
		opts.Slots, opts.SpareDisks, opts.GoInit = o.MaxSandboxes, o.SpareDisks, o.GoInit
		// The network namespaces and the volumes' mounts are below
		// --run-dir; a shared --volume-dir may have mounts below it.
		opts.PrivateDirs = []string{o.RunDir, o.VolumeDir}
		if o.InitBinary != OwnBinary {
			opts.InitBinary = o.InitBinary
		} else {
			log.Warn("sandboxes start from sandboxd's own binary, more slowly than from its init binary (--init-binary)", "init-binary", native.InitBinaryName)
		}
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
