package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

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
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/shared/logflags"
)

// DefaultRunDir holds what lives as long as the host's boot: the sandboxes'
// network namespaces.
const DefaultRunDir = "/run/skiff/sandboxd"

// serveOptions are serve's own flags, beside the server's.
type serveOptions struct {
	server      server.Options
	log         logflags.Options
	runtime     string
	runDir      string
	uidBase     uint32
	pidsLimit   int64
	pidsReserve int64
	cgroup      string
	ifacePrefix string
	nftTable    string
	denyCIDRs   []string
	allowCIDRs  []string
	runsc       string
	platform    string
}

func serveCommand(stateDir *string) *cobra.Command {
	o := serveOptions{server: server.NewOptions(), log: logflags.New(logflags.Text)}
	nativeDefaults := native.DefaultOptions("")
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: the sandbox API, the traffic relay and the admin port",
		Long: `Run the daemon. It re-adopts the sandboxes a previous sandboxd left
(running and paused ones keep their IDs, tokens and deadlines; those that
died meanwhile are cleaned up), then serves until SIGTERM. Sandboxes are not
its children: stopping sandboxd leaves them running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), *stateDir, &o)
		},
	}
	o.server.AddFlags(cmd.Flags())
	o.log.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&o.runtime, "runtime", native.Name, "The sandbox runtime: native (namespaces through libcontainer) or gvisor (gVisor's runsc, a user-space kernel).")
	cmd.Flags().StringVar(&o.runsc, "runsc", "runsc", "With --runtime gvisor: the static runsc binary (a path, or a name looked up in PATH).")
	cmd.Flags().StringVar(&o.platform, "runsc-platform", "systrap", "With --runtime gvisor: runsc's --platform.")
	cmd.Flags().StringVar(&o.runDir, "run-dir", DefaultRunDir, "Directory of the sandboxes' network namespaces (a tmpfs such as /run: they end with the boot).")
	cmd.Flags().Uint32Var(&o.uidBase, "uid-base", nativeDefaults.UIDBase, "First host uid and gid of the sandboxes' ranges: each sandbox gets 65536 ids from here; nothing else on the host may use them.")
	cmd.Flags().Int64Var(&o.pidsLimit, "pids-limit", nativeDefaults.PidsLimit, "Most processes (threads count) in one sandbox.")
	cmd.Flags().Int64Var(&o.pidsReserve, "host-pids-reserve", hostlimits.DefaultPidsReserve, "Processes kept for the host: all sandboxes together may have the host's PIDs and threads (the smaller of kernel.pid_max and kernel.threads-max) less this. "+
		"kernel.pid_max is raised, when lower, to --max-sandboxes × --pids-limit + this.")
	cmd.Flags().StringVar(&o.cgroup, "cgroup-parent", nativeDefaults.CgroupParent, "Cgroup, relative to sandboxd's own (cgroup v1) or beside it (v2), under which each sandbox gets one.")
	cmd.Flags().StringVar(&o.ifacePrefix, "iface-prefix", network.DefaultIfacePrefix, "Start of the host-side name of every sandbox's veth; no other interface may start with it.")
	cmd.Flags().StringVar(&o.nftTable, "nft-table", network.DefaultTable, "The nftables table (inet) of the sandboxes' isolation and NAT rules; sandboxd owns it.")
	cmd.Flags().StringSliceVar(&o.denyCIDRs, "deny-cidr", nil, "IPv4 prefixes no sandbox reaches, beside the private, shared (CGNAT), link-local and cloud metadata ranges always denied (repeat or comma-separate).")
	cmd.Flags().StringSliceVar(&o.allowCIDRs, "allow-cidr", nil, "IPv4 prefixes sandboxes with internet access reach even in a denied range, such as an internal service (repeat or comma-separate).")
	return cmd
}

// validate checks the server's options and serve's own.
func (o *serveOptions) validate() error {
	errs := []error{o.server.Validate()}
	if o.pidsLimit < 1 {
		errs = append(errs, fmt.Errorf("--pids-limit must be at least 1, got %d", o.pidsLimit))
	}
	if o.pidsReserve < 0 {
		errs = append(errs, fmt.Errorf("--host-pids-reserve must not be negative, got %d", o.pidsReserve))
	}
	for flag, list := range map[string][]string{"--deny-cidr": o.denyCIDRs, "--allow-cidr": o.allowCIDRs} {
		if _, err := prefixes(list); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flag, err))
		}
	}
	return errors.Join(errs...)
}

// prefixes parses IPv4 prefixes.
func prefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("%s is not IPv4: sandboxes have IPv4 only", p)
		}
		out = append(out, p)
	}
	return out, nil
}

func serve(ctx context.Context, stateDir string, o *serveOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	log, err := o.log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	slog.SetDefault(log) // the relay and libraries log through the default
	if o.runtime == native.Name {
		// Once, so that no sandbox start copies the binary (see there).
		if err := native.ReexecSealed(); err != nil {
			return err
		}
	}
	limits, err := hostlimits.Apply(hostlimits.Options{
		MaxSandboxes: o.server.MaxSandboxes, PidsLimit: o.pidsLimit, PidsReserve: o.pidsReserve, CgroupParent: o.cgroup,
	})
	if err != nil {
		return err
	}
	if limits.RaisedFrom != 0 {
		log.Info("raised kernel.pid_max for the sandboxes", "from", limits.RaisedFrom, "to", limits.PidMax)
	}
	log.Info("bounded the processes of all sandboxes together", "pids_max", limits.SandboxPids, "per_sandbox", o.pidsLimit,
		"kernel_pid_max", limits.PidMax, "kernel_threads_max", limits.ThreadsMax, "host_reserve", o.pidsReserve)
	stateDir, err = filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return err
	}
	st, err := store.Open(filepath.Join(stateDir, "records"))
	if err != nil {
		return err
	}
	reg, err := registry.Open(st, o.server.Limits())
	if err != nil {
		// Unreadable records were moved aside; the others load.
		log.Error("some sandbox records could not be read", "err", err)
	}
	pool, err := ipam.New(o.server.SandboxCIDR)
	if err != nil {
		return err
	}
	prefix, err := netip.ParsePrefix(o.server.SandboxCIDR)
	if err != nil {
		return err
	}
	lib, err := template.OpenLibrary(filepath.Join(stateDir, "templates"))
	if err != nil {
		return err
	}
	deny, _ := prefixes(o.denyCIDRs) // validated
	allow, _ := prefixes(o.allowCIDRs)
	nm, err := network.New(network.Options{
		RunDir: o.runDir, Table: o.nftTable, IfacePrefix: o.ifacePrefix, Pool: prefix, Deny: deny, Allow: allow,
	})
	if err != nil {
		return err
	}
	if err := nm.Init(ctx); err != nil {
		return err
	}
	defer nm.Close()
	rt, err := newRuntime(stateDir, o, log)
	if err != nil {
		return err
	}
	// Releases what the runtime holds for itself; sandboxes keep running.
	defer rt.Close()
	svc, err := service.New(o.server.ServiceConfig(), service.Deps{
		Runtime:   rt,
		Network:   networkAdapter{nm},
		Templates: lib,
		Registry:  reg,
		IPAM:      pool,
		LogDir:    filepath.Join(stateDir, "logs"),
		Logger:    log,
	})
	if err != nil {
		return err
	}
	srv, err := server.New(o.server, svc, log)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// runtime is a sandbox runtime that holds something of its own to release.
type runtime interface {
	sandboxrt.Runtime
	Close() error
}

func newRuntime(stateDir string, o *serveOptions, log *slog.Logger) (runtime, error) {
	switch o.runtime {
	case native.Name:
		if o.server.DefaultDiskMiB > 0 {
			if err := native.CheckDisks(); err != nil {
				return nil, err
			}
		}
		opts := native.DefaultOptions(filepath.Join(stateDir, native.Name))
		opts.UIDBase, opts.PidsLimit, opts.CgroupParent, opts.Logger = o.uidBase, o.pidsLimit, o.cgroup, log
		opts.Slots = o.server.MaxSandboxes
		return native.New(opts)
	case gvisor.Name:
		runsc, err := exec.LookPath(o.runsc)
		if err != nil {
			return nil, fmt.Errorf("--runsc: %w (build it with make runsc)", err)
		}
		opts := gvisor.DefaultOptions(filepath.Join(stateDir, gvisor.Name), runsc)
		opts.Platform, opts.PidsLimit, opts.CgroupParent, opts.Logger = o.platform, o.pidsLimit, o.cgroup, log
		return gvisor.New(opts)
	default:
		return nil, fmt.Errorf("--runtime %q: not one of %q", o.runtime, []string{native.Name, gvisor.Name})
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
