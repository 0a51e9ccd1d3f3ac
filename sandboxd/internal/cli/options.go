package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/egressproxy"
	"github.com/skiff-dev/skiff/sandboxd/internal/hostlimits"
	"github.com/skiff-dev/skiff/sandboxd/internal/network"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/gvisor"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/selfexe"
	"github.com/skiff-dev/skiff/sandboxd/internal/server"
	"github.com/skiff-dev/skiff/sandboxd/internal/service"
	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/logflags"
)

const (
	// DefaultStateDir is where sandboxd keeps its records and templates.
	DefaultStateDir = "/var/lib/skiff/sandboxd"
	// DefaultRunDir holds what lives as long as the host's boot: the
	// sandboxes' network namespaces and the native runtime's state of the
	// running sandboxes.
	DefaultRunDir = "/run/skiff/sandboxd"
	// DefaultEnvdPath is where packages install the static envd when it
	// does not sit beside sandboxd's own binary.
	DefaultEnvdPath = "/usr/local/lib/skiff/envd"
	// DefaultInitBinaryPath is where packages install sandboxd-init when
	// it does not sit beside sandboxd's own binary.
	DefaultInitBinaryPath = "/usr/local/lib/skiff/" + native.InitBinaryName
	// OwnBinary is the --init-binary that runs each sandbox's init from
	// sandboxd's own binary.
	OwnBinary = "self"
)

// GlobalOptions are the flags of every subcommand: the root command's
// persistent flags.
type GlobalOptions struct {
	// StateDir holds sandboxd's records, templates, logs and runtime state.
	StateDir string
}

// NewGlobalOptions returns the defaults.
func NewGlobalOptions() *GlobalOptions {
	return &GlobalOptions{StateDir: DefaultStateDir}
}

// AddFlags registers --state-dir, defaulting to the field's value.
func (o *GlobalOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.StateDir, "state-dir", o.StateDir, "Directory of sandboxd's state: its records, the templates (templates/<name>/<version>/rootfs), "+
		"the sandboxes' logs and the runtime's state; not empty. With the native runtime every directory above it must be searchable by others; with gvisor it must not hold ',' or ':'.")
}

// Options are the flags of `sandboxd serve`: the daemon's API server
// (server.Config), its service and sandboxes (service.Config), the
// runtime, the network and the host's limits.
type Options struct {
	// Global is --state-dir, which the root command registers.
	Global *GlobalOptions
	Log    logflags.Options

	// Listen is the API and relay address (the NodeInventory endpoint).
	Listen string
	// Admin is --admin-listen (/metrics, /healthz, /readyz; keep it off the
	// network) and --enable-pprof.
	Admin daemon.AdminOptions
	// NodeName names the host; the tag in its sandbox IDs derives from it.
	NodeName string

	// AuthTokenFile holds the token every caller must present.
	AuthTokenFile string
	// TLSCert and TLSKey serve TLS; with ClientCA, callers must present a
	// certificate it signed (mTLS) and need no token.
	TLSCert  string
	TLSKey   string
	ClientCA string
	// PeerCA is the CA bundle other hosts' sandboxd certificates chain to,
	// for snapshot pulls from a host that serves TLS.
	PeerCA string
	// InsecureNoAuth serves without any authentication, for development.
	InsecureNoAuth bool
	// Shutdown bounds the graceful stop of the listeners. Sandboxes keep
	// running through it: they are not sandboxd's children.
	Shutdown daemon.ShutdownOptions

	// MaxSandboxes, CPUCapacity (millicores) and MemoryCapacity (MiB) are
	// the host's capacity. MemoryOvercommit multiplies memory;
	// CPUOvercommit multiplies CPU, and 0 admits no CPU at all (a
	// sandbox's vCPUs are its limit, not a reservation).
	MaxSandboxes     int
	CPUCapacity      int64
	MemoryCapacity   int64
	CPUOvercommit    float64
	MemoryOvercommit float64

	// SandboxCIDR is the pool of the sandboxes' addresses, a /30 each.
	SandboxCIDR string
	// Envd is the static envd binary every sandbox runs as its init.
	Envd string
	// InitBinary is the binary libcontainer runs as each native sandbox's
	// init before it becomes envd (sandboxd-init), or OwnBinary.
	InitBinary string
	// GoInit has every native sandbox set up by libcontainer's Go init
	// rather than the init in C.
	GoInit bool
	// SpareDisks is how many emptied disks of each size the native
	// runtime keeps mounted for the next sandboxes.
	SpareDisks int
	// EnvdReadyTimeout bounds how long a new sandbox's envd may take to
	// answer /health.
	EnvdReadyTimeout time.Duration
	// PreparedSandboxes is how many sandboxes are kept prepared for cold
	// creates, per template (package prepared); 0 turns it off.
	PreparedSandboxes int
	// SnapshotMemory keeps a sandbox's memory and processes in its
	// snapshots and forks where the runtime can (gvisor).
	SnapshotMemory bool
	// MaxTimeout bounds a sandbox's lifetime.
	MaxTimeout time.Duration
	// DefaultCPUMilli, DefaultMemoryMiB and DefaultDiskMiB are a sandbox's
	// resources when the request leaves them 0 (e2b: 2 vCPU, 512 MiB).
	DefaultCPUMilli  int64
	DefaultMemoryMiB int64
	DefaultDiskMiB   int64
	// VolumeDir is the volume store (package volume); empty: <state-dir>/volumes.
	VolumeDir string
	// VolumeShared says VolumeDir is a filesystem every host mounts.
	VolumeShared bool
	// VolumeSizeMiB is each new volume's size (an ext4 image); 0: plain
	// directories, unlimited.
	VolumeSizeMiB int64
	// DiskReserveMiB is the free space the state directory's and the
	// volume store's filesystems keep (service.Config.DiskReserveMiB).
	DiskReserveMiB int64
	// MetricsInterval is how often every running sandbox's resource use is
	// sampled; MetricsSamples how many samples each keeps.
	MetricsInterval time.Duration
	MetricsSamples  int

	// Runtime is native or gvisor; Runsc and RunscPlatform are gvisor's.
	Runtime       string
	Runsc         string
	RunscPlatform string
	// UIDBase starts the sandboxes' uid and gid ranges (native).
	UIDBase uint32
	// PidsLimit bounds one sandbox's processes; PidsReserve keeps some of
	// the host's for the host; CgroupParent holds the sandboxes' cgroups.
	PidsLimit    int64
	PidsReserve  int64
	CgroupParent string
	// CgroupFavorDynmods remounts the host's cgroup2 hierarchy with
	// favordynmods at start (package hostlimits).
	CgroupFavorDynmods bool

	// RunDir holds the sandboxes' network namespaces and the native
	// runtime's state of running sandboxes; IfacePrefix starts
	// their veths' names and NFTTable holds their rules. DenyCIDRs and
	// AllowCIDRs change what sandboxes may reach.
	RunDir      string
	IfacePrefix string
	NFTTable    string
	DenyCIDRs   []string
	AllowCIDRs  []string
	// ResolvConf is the resolv.conf whose nameservers sandboxes use.
	ResolvConf string
	// EgressTeamShare is the share of the egress filters' connections and
	// queries one team's sandboxes hold at most, as 1/N
	// (egressproxy.Options.TeamShare); 1: no bound by team.
	EgressTeamShare int
	// EgressProxyPort and DNSFilterPort are where the egress proxy and
	// the DNS filter listen on the host; 0 picks a free port.
	EgressProxyPort, DNSFilterPort uint16
}

// NewOptions returns the defaults. Those that come from the host (the node's
// name, the capacities, envd's path) are left empty, and Complete fills them.
func NewOptions() *Options {
	nativeDefaults := native.DefaultOptions("")
	return &Options{
		Global:             NewGlobalOptions(),
		Log:                logflags.New(logflags.Text),
		Listen:             ":27777",
		Admin:              daemon.AdminOptions{Listen: "127.0.0.1:27778"},
		Shutdown:           daemon.ShutdownOptions{Timeout: 10 * time.Second},
		MaxSandboxes:       256,
		MemoryOvercommit:   1.0,
		SandboxCIDR:        "10.213.0.0/16",
		EnvdReadyTimeout:   10 * time.Second,
		PreparedSandboxes:  1,
		SnapshotMemory:     true,
		MaxTimeout:         24 * time.Hour,
		DefaultCPUMilli:    2000,
		DefaultMemoryMiB:   512,
		DefaultDiskMiB:     10240,
		VolumeSizeMiB:      10240,
		DiskReserveMiB:     2048,
		EgressTeamShare:    egressproxy.DefaultTeamShare,
		MetricsInterval:    5 * time.Second,
		MetricsSamples:     120,
		Runtime:            native.Name,
		Runsc:              "runsc",
		RunscPlatform:      "systrap",
		UIDBase:            nativeDefaults.UIDBase,
		PidsLimit:          nativeDefaults.PidsLimit,
		SpareDisks:         nativeDefaults.SpareDisks,
		PidsReserve:        hostlimits.DefaultPidsReserve,
		CgroupParent:       nativeDefaults.CgroupParent,
		CgroupFavorDynmods: true,
		RunDir:             DefaultRunDir,
		IfacePrefix:        network.DefaultIfacePrefix,
		NFTTable:           network.DefaultTable,
	}
}

// AddFlags registers serve's flags (not --state-dir: GlobalOptions), each
// defaulting to the field's value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Log.AddFlags(fs)
	fs.StringVar(&o.Listen, "listen", o.Listen, "Address (host:port) of the Connect API (shared/sandboxdapi) and of the relay into sandbox ports: h2c and HTTP/1.1, "+
		"or with --tls-cert HTTP/2 and HTTP/1.1 over TLS.")
	o.Admin.AddFlags(fs, false)
	daemon.AddHelp(fs, "admin-listen", "It must not be empty. /healthz is 200 once the sandboxes found at start are re-adopted, while the registry answers and the state directory is there; "+
		"/readyz is 200 except while shutting down.")
	daemon.AddHelp(fs, "enable-pprof", "A warning is logged when --admin-listen is not a loopback address.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "This host's name: sandbox IDs end in a tag derived from it, so keep it stable; vk-sandbox's --node-name must be the same. Empty: the host name.")
	fs.StringVar(&o.AuthTokenFile, "auth-token-file", o.AuthTokenFile, "File holding the node token callers must present, read at start: its content without surrounding white space, at least 16 characters; "+
		"the fleet-wide token, or this host's own (sandbox-apiserver node-token prints it). RPCs send it as Authorization: Bearer or Skiff-Node-Token, relayed requests "+
		"as Skiff-Node-Token only, which is removed before the request reaches the sandbox. This, --client-ca or --insecure-no-auth is required.")
	fs.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "Server certificate (PEM): --listen serves TLS 1.2+, HTTP/2 and HTTP/1.1 through ALPN. Needs --tls-key.")
	fs.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "Private key (PEM) of --tls-cert; the two go together.")
	fs.StringVar(&o.PeerCA, "peer-ca", o.PeerCA, "CA bundle (PEM) that other hosts' sandboxd certificates chain to, for snapshot pulls (PullSnapshot) from hosts that serve TLS; "+
		"empty: the system's roots. A pull is opened by a ticket the control plane makes for one snapshot, never by a token.")
	fs.StringVar(&o.ClientCA, "client-ca", o.ClientCA, "CA bundle (PEM) that callers' certificates must chain to (mTLS); callers then need no token, unless --auth-token-file is set too. "+
		"Needs --tls-cert and --tls-key.")
	fs.BoolVar(&o.InsecureNoAuth, "insecure-no-auth", o.InsecureNoAuth, "Serve without authentication: anyone who reaches --listen controls every sandbox (development only). "+
		"Excludes --auth-token-file and --client-ca; without it, serve refuses to start with neither of them.")
	o.Shutdown.AddFlags(fs, "Watch streams end at the start of the drain. Sandboxes keep running: they are not sandboxd's children, and the next start re-adopts them.")

	fs.IntVar(&o.MaxSandboxes, "max-sandboxes", o.MaxSandboxes, "Most sandboxes (running, paused and warm) this host holds at once; beyond, Create answers resource_exhausted. "+
		"Also the number of uid ranges (native runtime). At least 1, and at most the /30 blocks of --sandbox-cidr.")
	fs.Int64Var(&o.CPUCapacity, "cpu-capacity", o.CPUCapacity, "CPU the host gives sandboxes, in millicores; 0: every CPU of the host.")
	fs.Int64Var(&o.MemoryCapacity, "memory-capacity", o.MemoryCapacity, "Memory the host gives sandboxes, in MiB; 0: the host's MemTotal.")
	fs.Float64Var(&o.CPUOvercommit, "cpu-overcommit", o.CPUOvercommit, "How far the sandboxes' vCPUs together may exceed --cpu-capacity (a factor); beyond, Create answers resource_exhausted. "+
		"0: CPU is not admitted: a sandbox's vCPU count is its limit (cgroup cpu.max), not a reservation, and the sandboxes share the host's cores, "+
		"so only memory and --max-sandboxes bound how many run. At most 100.")
	fs.Float64Var(&o.MemoryOvercommit, "memory-overcommit", o.MemoryOvercommit, "How far the sandboxes' memory together may exceed --memory-capacity (a factor); beyond, Create answers resource_exhausted. "+
		"A sandbox's memory is its limit and an idle one uses a few MiB of it: above 1 holds more sandboxes, at the risk of the kernel's OOM killer when they all use theirs. Above 0, at most 100.")
	fs.Var(bothOvercommit{o}, "overcommit", "Sets --cpu-overcommit and --memory-overcommit to one factor.")
	_ = fs.MarkDeprecated("overcommit", "use --cpu-overcommit and --memory-overcommit")

	fs.StringVar(&o.SandboxCIDR, "sandbox-cidr", o.SandboxCIDR, "IPv4 pool of sandbox addresses, a /30 per sandbox: a prefix between /8 and /29 with room for --max-sandboxes. "+
		"It must not overlap the host's networks.")
	fs.StringVar(&o.Envd, "envd", o.Envd, "The static envd binary every sandbox runs as its init; empty: envd beside sandboxd's binary, else "+DefaultEnvdPath+".")
	fs.BoolVar(&o.GoInit, "go-init", o.GoInit, "Set up every native sandbox with libcontainer's init in Go. By default a sandbox without volumes is set up by its init in C (the runc fork's patch 0005): the same steps, without starting Go's runtime in every sandbox.")
	fs.StringVar(&o.InitBinary, "init-binary", o.InitBinary, "The binary each sandbox of the native runtime starts as, before it becomes envd: the "+native.InitBinaryName+" of sandboxd's own build. "+
		"Empty: "+native.InitBinaryName+" beside sandboxd's binary, else "+DefaultInitBinaryPath+", else sandboxd's own binary, which starts sandboxes more slowly ("+OwnBinary+" chooses that).")
	fs.DurationVar(&o.EnvdReadyTimeout, "envd-ready-timeout", o.EnvdReadyTimeout, "How long a new sandbox's envd may take to answer before its Create fails (and is undone); greater than 0.")
	fs.BoolVar(&o.SnapshotMemory, "snapshot-memory", o.SnapshotMemory, "Keep a sandbox's memory and processes in its snapshots and forks, where the runtime can (gvisor: runsc checkpoint; the native runtime keeps files only): "+
		"a sandbox from such a snapshot runs on from where its source was. false keeps files only, which takes less disk and time.")
	fs.IntVar(&o.PreparedSandboxes, "prepared-sandboxes", o.PreparedSandboxes, "Sandboxes kept prepared for cold creates, per template created from (native runtime): network, root, cgroup, "+
		"namespaces and seccomp set up, envd not started. 0 turns it off; at most 16.")
	fs.DurationVar(&o.MaxTimeout, "max-timeout", o.MaxTimeout, "Longest lifetime a Create, Claim, SetTimeout or Resume may give a sandbox; greater than 0.")
	fs.Int64Var(&o.DefaultCPUMilli, "default-cpu", o.DefaultCPUMilli, fmt.Sprintf("A sandbox's CPU, in millicores, when the request gives none (e2b's default); at least %d.", service.MinCPUMilli))
	fs.Int64Var(&o.DefaultMemoryMiB, "default-memory", o.DefaultMemoryMiB, fmt.Sprintf("A sandbox's memory, in MiB, when the request gives none (e2b's default); at least %d.", service.MinMemoryMiB))
	fs.Int64Var(&o.DefaultDiskMiB, "default-disk", o.DefaultDiskMiB, fmt.Sprintf("A sandbox's writable disk, in MiB, when the request gives none; at most %d. "+
		"0: no disk of its own, its writes go unbounded to the state directory's filesystem. Above 0 the native runtime needs loop devices and mkfs.ext4, checked at start.", service.MaxDiskMiB))
	fs.StringVar(&o.VolumeDir, "volume-dir", o.VolumeDir, "Where the host's volumes (e2b's volumes) are kept; empty: <state-dir>/volumes. "+
		"With --volume-shared, a filesystem every host mounts at this path (NFS, CephFS, a CSI volume), so that any host serves any volume.")
	fs.BoolVar(&o.VolumeShared, "volume-shared", o.VolumeShared, "--volume-dir is shared by hosts: volumes are plain directories there (their size is the shared filesystem's to bound), "+
		"and sandboxes that mount one are placed on any host of the store rather than on the volume's one host. Needs --volume-size 0.")
	fs.Int64Var(&o.VolumeSizeMiB, "volume-size", o.VolumeSizeMiB, "Each new volume's size, in MiB: an ext4 image of that size, loop-mounted, where writes past it fail with ENOSPC (needs loop devices and mkfs.ext4, checked at start); "+
		"0: plain directories on --volume-dir's filesystem, unlimited.")
	fs.Int64Var(&o.DiskReserveMiB, "disk-reserve", o.DiskReserveMiB, "Free space, in MiB (as df's Avail), that --state-dir's and --volume-dir's filesystems keep: below it this host refuses creates, snapshots, forks, "+
		"snapshot pulls, pauses that write to disk and new volumes (resource_exhausted, so the apiserver places them on another host). "+
		"Sandboxes' disks are sparse: what their sizes promise is not reserved, and a full disk fails every sandbox of the host. 0: no reserve.")
	fs.DurationVar(&o.MetricsInterval, "metrics-interval", o.MetricsInterval, "How often each running sandbox's CPU, memory and disk use is sampled for the Metrics RPC; greater than 0.")
	fs.IntVar(&o.MetricsSamples, "metrics-samples", o.MetricsSamples, "How many samples of each sandbox are kept for the Metrics RPC (--metrics-interval apart); at least 2.")

	fs.StringVar(&o.Runtime, "runtime", o.Runtime, "The sandbox runtime: native (namespaces through libcontainer) or gvisor (gVisor's runsc, a user-space kernel).")
	fs.StringVar(&o.Runsc, "runsc", o.Runsc, "With --runtime gvisor: the static runsc binary (a path, or a name looked up in PATH; make runsc builds one); not empty.")
	fs.StringVar(&o.RunscPlatform, "runsc-platform", o.RunscPlatform, "With --runtime gvisor: runsc's --platform, passed as is (systrap or ptrace).")
	fs.Uint32Var(&o.UIDBase, "uid-base", o.UIDBase, "First host uid and gid of the sandboxes' id ranges (native runtime), 65536 each: nothing else on the host may use "+
		"[uid-base, uid-base + 65536 × --max-sandboxes), which must stay below 2^32. Two sandboxds on one machine (a local fleet) need disjoint ranges: "+
		"with the same base their sandboxes share host uids, and so the kernel's per-user limits (inotify instances, pending signals).")
	fs.Int64Var(&o.PidsLimit, "pids-limit", o.PidsLimit, "Most processes (threads count) in one sandbox; at least 1.")
	fs.IntVar(&o.SpareDisks, "spare-disks", o.SpareDisks, "Disks of ended sandboxes kept mounted, emptied, for the next sandboxes of the same disk size (native runtime), per size: a start then skips making, attaching and mounting one, "+
		"and an end unmounting and deleting it. A disk with more than a few thousand files is not kept. 0 keeps none; at most 64.")
	fs.Int64Var(&o.PidsReserve, "host-pids-reserve", o.PidsReserve, "Processes kept for the host: all sandboxes together may have the smaller of kernel.pid_max and kernel.threads-max "+
		"less this (the pids.max of --cgroup-parent). At start kernel.pid_max is raised, when lower, to --max-sandboxes × --pids-limit + this (at most 4194304); "+
		"serve refuses to start when it cannot, or when the sandboxes' share is below one --pids-limit. Not negative.")
	fs.BoolVar(&o.CgroupFavorDynmods, "cgroup-favor-dynmods", o.CgroupFavorDynmods, "At start, set the cgroup2 option favordynmods on the host's cgroup2 hierarchy (the unified one of a hybrid host), keeping its other options: "+
		"moving each new sandbox into its cgroups (and each process envd starts into its sandbox's workload cgroup) then no longer waits for an RCU grace period (5 to 17 ms a start), "+
		"at the cost of slightly slower forks and exits host-wide. "+
		"One setting for the whole kernel that outlives sandboxd (Linux 6.18 keeps it until reboot); false leaves the host as it is and undoes nothing. "+
		"Where it cannot be set (no cgroup2 mount, a kernel before 6.0, no permission) serve warns and starts.")
	fs.StringVar(&o.CgroupParent, "cgroup-parent", o.CgroupParent, "Cgroup under which each sandbox gets its own, relative: below sandboxd's cgroup on cgroup v1, beside it on v2.")

	fs.StringVar(&o.RunDir, "run-dir", o.RunDir, "Directory of what ends with the host's boot: the sandboxes' network namespaces (netns/<id>) and the native runtime's state of each running sandbox (native/containers/<id>); a tmpfs such as /run.")
	fs.StringVar(&o.IfacePrefix, "iface-prefix", o.IfacePrefix, "Start of the name of every sandbox's veth host end (in the router namespace) and of the host's link to that namespace (<prefix>-rt), 1 to 8 of [a-z0-9_-]; no other interface of the host may start with it.")
	fs.StringVar(&o.NFTTable, "nft-table", o.NFTTable, "The nftables table (family inet) of the sandboxes' isolation and NAT rules; sandboxd owns it and reinstalls it at start.")
	fs.StringSliceVar(&o.DenyCIDRs, "deny-cidr", o.DenyCIDRs, "IPv4 prefixes no sandbox reaches, beside the private, shared (CGNAT), link-local and cloud metadata ranges always denied "+
		"(repeat or comma-separate).")
	fs.StringSliceVar(&o.AllowCIDRs, "allow-cidr", o.AllowCIDRs, "IPv4 prefixes sandboxes with internet access reach even in a denied range, such as an internal service (repeat or comma-separate).")
	fs.StringVar(&o.ResolvConf, "resolv-conf", o.ResolvConf, "A resolv.conf whose IPv4 nameservers the sandboxes use (and the egress filters ask); empty: the host's /etc/resolv.conf, "+
		"or systemd-resolved's upstream servers when that names only a local stub.")
	fs.IntVar(&o.EgressTeamShare, "egress-team-share", o.EgressTeamShare, "One team's sandboxes together hold at most 1/N of the egress proxy's connections (16,384) and of the DNS filter's queries (4,096) "+
		"that sandboxes with outbound rules share, beside 1/16 for one sandbox, so that one tenant cannot cut the others' filtered egress off; 1 to 16, 1: no bound by team (a host of one team).")
	fs.Uint16Var(&o.EgressProxyPort, "egress-proxy-port", o.EgressProxyPort, "Port on 127.0.0.1 of the egress proxy, "+
		"which decides the connections to ports 80 and 443 of sandboxes whose rules allow domain names (by their TLS SNI or HTTP Host); 0: a free port.")
	fs.Uint16Var(&o.DNSFilterPort, "dns-filter-port", o.DNSFilterPort, "Port (UDP and TCP, as --egress-proxy-port) of the DNS filter, "+
		"which answers the DNS of sandboxes whose rules deny all traffic for their allowed names only; 0: a free port.")
}

// Complete fills what derives from the flags and the host: the node's
// name, the capacities and envd's path when the flags left them empty, and
// the state directory made absolute (the runtimes keep paths below it in
// their records).
func (o *Options) Complete() error {
	if o.NodeName == "" {
		o.NodeName, _ = os.Hostname() // Validate reports it if still empty
	}
	if o.CPUCapacity == 0 {
		o.CPUCapacity = int64(runtime.NumCPU()) * 1000
	}
	if o.MemoryCapacity == 0 {
		o.MemoryCapacity = hostMemoryMiB() // 0 when unreadable: Validate reports it
	}
	if o.Envd == "" {
		o.Envd = defaultEnvd()
	}
	if o.InitBinary == "" {
		o.InitBinary = besideOrInstalled(native.InitBinaryName, DefaultInitBinaryPath, OwnBinary)
	}
	if o.Global.StateDir == "" {
		return nil // Validate reports it
	}
	dir, err := filepath.Abs(o.Global.StateDir)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	o.Global.StateDir = dir
	return nil
}

// Validate reports every option that cannot work, naming its flag. Call it
// after Complete.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Global.StateDir == "" {
		add("--state-dir must not be empty")
	}
	if err := o.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		add("--listen %q: %w", o.Listen, err)
	}
	if err := o.Admin.Validate(false, map[string]string{"--listen": o.Listen}); err != nil {
		errs = append(errs, err)
	}
	if o.NodeName == "" {
		add("--node-name must not be empty")
	}
	errs = append(errs, o.validateAuth()...)
	if err := o.Shutdown.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxSandboxes < 1 {
		add("--max-sandboxes must be at least 1, got %d", o.MaxSandboxes)
	}
	if o.CPUCapacity < 1 {
		add("--cpu-capacity must be positive, got %d", o.CPUCapacity)
	}
	if o.MemoryCapacity < 1 {
		add("--memory-capacity must be positive, got %d (is /proc/meminfo readable?)", o.MemoryCapacity)
	}
	if !(o.CPUOvercommit >= 0 && o.CPUOvercommit <= 100) {
		add("--cpu-overcommit must be between 0 (CPU not admitted) and 100, got %g", o.CPUOvercommit)
	}
	if !(o.MemoryOvercommit > 0 && o.MemoryOvercommit <= 100) {
		add("--memory-overcommit must be above 0 and at most 100, got %g", o.MemoryOvercommit)
	}
	errs = append(errs, o.validateCIDR()...)
	errs = append(errs, o.validateSandboxes()...)
	errs = append(errs, o.validateRuntime()...)
	for _, l := range []struct {
		flag string
		list []string
	}{{"--deny-cidr", o.DenyCIDRs}, {"--allow-cidr", o.AllowCIDRs}} {
		if _, err := prefixes(l.list); err != nil {
			add("%s: %w", l.flag, err)
		}
	}
	return errors.Join(errs...)
}

func (o *Options) validateAuth() []error {
	var errs []error
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if o.ClientCA != "" && o.TLSCert == "" {
		errs = append(errs, errors.New("--client-ca needs --tls-cert and --tls-key"))
	}
	authenticated := o.AuthTokenFile != "" || o.ClientCA != ""
	switch {
	case o.InsecureNoAuth && authenticated:
		errs = append(errs, errors.New("--insecure-no-auth conflicts with --auth-token-file and --client-ca"))
	case !o.InsecureNoAuth && !authenticated:
		errs = append(errs, errors.New("set --auth-token-file, or --tls-cert, --tls-key and --client-ca (mTLS); --insecure-no-auth serves without authentication"))
	}
	return errs
}

func (o *Options) validateCIDR() []error {
	p, err := netip.ParsePrefix(o.SandboxCIDR)
	if err != nil {
		return []error{fmt.Errorf("--sandbox-cidr %q: %w", o.SandboxCIDR, err)}
	}
	if !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 29 {
		return []error{fmt.Errorf("--sandbox-cidr %q: want an IPv4 prefix between /8 and /29", o.SandboxCIDR)}
	}
	if blocks := 1 << (30 - p.Bits()); o.MaxSandboxes > blocks {
		return []error{fmt.Errorf("--sandbox-cidr %s addresses %d sandboxes, fewer than --max-sandboxes %d", p, blocks, o.MaxSandboxes)}
	}
	return nil
}

func (o *Options) validateSandboxes() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Envd == "" {
		add("--envd must not be empty")
	}
	if o.EnvdReadyTimeout <= 0 {
		add("--envd-ready-timeout must be positive, got %s", o.EnvdReadyTimeout)
	}
	if o.PreparedSandboxes < 0 || o.PreparedSandboxes > 16 {
		add("--prepared-sandboxes must be between 0 and 16, got %d", o.PreparedSandboxes)
	}
	if o.MaxTimeout <= 0 {
		add("--max-timeout must be positive, got %s", o.MaxTimeout)
	}
	if o.DefaultCPUMilli < service.MinCPUMilli {
		add("--default-cpu must be at least %dm, got %d", service.MinCPUMilli, o.DefaultCPUMilli)
	}
	if o.DefaultMemoryMiB < service.MinMemoryMiB {
		add("--default-memory must be at least %d MiB, got %d", service.MinMemoryMiB, o.DefaultMemoryMiB)
	}
	if o.VolumeSizeMiB < 0 || (o.VolumeSizeMiB > 0 && o.VolumeSizeMiB < diskimage.MinMiB) {
		add("--volume-size must be 0 or at least %d MiB, got %d", diskimage.MinMiB, o.VolumeSizeMiB)
	}
	if o.VolumeShared && o.VolumeSizeMiB != 0 {
		add("--volume-shared needs --volume-size 0: an image must not be mounted by two hosts, so shared volumes are directories whose size the shared filesystem bounds")
	}
	if o.VolumeShared && o.VolumeDir == "" {
		add("--volume-shared needs --volume-dir: the shared filesystem's mount point")
	}
	if o.DefaultDiskMiB < 0 || o.DefaultDiskMiB > service.MaxDiskMiB {
		add("--default-disk must be between 0 and %d MiB, got %d", service.MaxDiskMiB, o.DefaultDiskMiB)
	}
	if o.EgressTeamShare < 1 || o.EgressTeamShare > 16 {
		add("--egress-team-share must be between 1 and 16, got %d", o.EgressTeamShare)
	}
	if o.DiskReserveMiB < 0 || o.DiskReserveMiB > 1<<30 {
		add("--disk-reserve must be between 0 and %d MiB, got %d", 1<<30, o.DiskReserveMiB)
	}
	if o.MetricsInterval <= 0 {
		add("--metrics-interval must be positive, got %s", o.MetricsInterval)
	}
	if o.MetricsSamples < 2 {
		add("--metrics-samples must be at least 2, got %d", o.MetricsSamples)
	}
	return errs
}

func (o *Options) validateRuntime() []error {
	var errs []error
	switch o.Runtime {
	case native.Name:
	case gvisor.Name:
		if o.Runsc == "" {
			errs = append(errs, errors.New("--runsc must not be empty with --runtime gvisor"))
		}
	default:
		errs = append(errs, fmt.Errorf("--runtime %q: not one of %q", o.Runtime, []string{native.Name, gvisor.Name}))
	}
	if o.SpareDisks < 0 || o.SpareDisks > 64 {
		errs = append(errs, fmt.Errorf("--spare-disks must be between 0 and 64, got %d", o.SpareDisks))
	}
	if o.PidsLimit < 1 {
		errs = append(errs, fmt.Errorf("--pids-limit must be at least 1, got %d", o.PidsLimit))
	}
	if o.PidsReserve < 0 {
		errs = append(errs, fmt.Errorf("--host-pids-reserve must not be negative, got %d", o.PidsReserve))
	}
	return errs
}

// Limits are the registry's limits: the capacities times their
// overcommits. With CPU not admitted, CPUMilli is the host's CPU as it is.
func (o *Options) Limits() registry.Limits {
	l := registry.Limits{
		MaxSandboxes: o.MaxSandboxes,
		CPUMilli:     o.CPUCapacity,
		CPUShared:    o.CPUOvercommit == 0,
		MemoryMiB:    int64(math.Floor(float64(o.MemoryCapacity) * o.MemoryOvercommit)),
	}
	if !l.CPUShared {
		l.CPUMilli = int64(math.Floor(float64(o.CPUCapacity) * o.CPUOvercommit))
	}
	return l
}

// bothOvercommit is the deprecated --overcommit: one factor for CPU and
// memory.
type bothOvercommit struct{ o *Options }

func (b bothOvercommit) String() string {
	if b.o == nil || b.o.CPUOvercommit != b.o.MemoryOvercommit {
		return ""
	}
	return strconv.FormatFloat(b.o.MemoryOvercommit, 'g', -1, 64)
}

func (b bothOvercommit) Set(v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return err
	}
	b.o.CPUOvercommit, b.o.MemoryOvercommit = f, f
	return nil
}

func (bothOvercommit) Type() string { return "float" }

// ServerConfig is the API server's part of the options.
func (o *Options) ServerConfig() server.Config {
	return server.Config{
		Listen: o.Listen, Admin: o.Admin,
		AuthTokenFile: o.AuthTokenFile, TLSCert: o.TLSCert, TLSKey: o.TLSKey, ClientCA: o.ClientCA, InsecureNoAuth: o.InsecureNoAuth,
		ShutdownTimeout: o.Shutdown.Timeout,
	}
}

// ServiceConfig is the service's part of the options.
func (o *Options) ServiceConfig() service.Config {
	return service.Config{
		NodeName: o.NodeName, Limits: o.Limits(),
		Envd: o.Envd, EnvdReadyTimeout: o.EnvdReadyTimeout, PreparedSandboxes: o.PreparedSandboxes, MaxTimeout: o.MaxTimeout,
		SnapshotMemory:  o.SnapshotMemory,
		DefaultCPUMilli: o.DefaultCPUMilli, DefaultMemoryMiB: o.DefaultMemoryMiB, DefaultDiskMiB: o.DefaultDiskMiB,
		MetricsInterval: o.MetricsInterval, MetricsSamples: o.MetricsSamples,
		DiskReserveMiB: o.DiskReserveMiB,
	}
}

// NetworkOptions are the sandboxes' network's options; call it after
// Validate.
func (o *Options) NetworkOptions() network.Options {
	pool, _ := netip.ParsePrefix(o.SandboxCIDR) // validated
	deny, _ := prefixes(o.DenyCIDRs)
	allow, _ := prefixes(o.AllowCIDRs)
	return network.Options{RunDir: o.RunDir, Table: o.NFTTable, IfacePrefix: o.IfacePrefix, Pool: pool, Deny: deny, Allow: allow, ResolvConf: o.ResolvConf}
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

// defaultEnvd is envd beside sandboxd's own binary when there is one, else
// DefaultEnvdPath.
func defaultEnvd() string { return besideOrInstalled("envd", DefaultEnvdPath, DefaultEnvdPath) }

// besideOrInstalled is the file name beside sandboxd's own binary when
// there is one, else installed when that exists, else otherwise.
func besideOrInstalled(name, installed, otherwise string) string {
	if exe, err := selfexe.Path(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	if fi, err := os.Stat(installed); err == nil && fi.Mode().IsRegular() {
		return installed
	}
	return otherwise
}

// hostMemoryMiB is MemTotal from /proc/meminfo, or 0 when unreadable.
func hostMemoryMiB() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return parseMemTotal(data)
}

func parseMemTotal(data []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0
		}
		kib, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0
		}
		return kib / 1024
	}
	return 0
}
