// Package service is sandboxd's API: the Connect service SandboxdService
// (create, warm, claim, kill, pause, resume, watch, …) and, on the same
// handler, the relay into sandbox ports. Serving it — listeners, TLS, the
// node token, the admin endpoints — is package server's.
//
// The service owns everything around a sandbox — its record in the
// registry, its address, network namespace, access token and deadline — and
// leaves its processes to a runtime (sandboxrt). A create reserves capacity
// first and undoes every step in reverse order when a later one fails, so a
// failed create leaves nothing behind. Operations on one sandbox are
// serialised; a restarted sandboxd re-adopts the sandboxes its records name
// (Recover) and cleans up what no record names.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/skiff-dev/skiff/sandboxd/internal/deadline"
	"github.com/skiff-dev/skiff/sandboxd/internal/egressproxy"
	"github.com/skiff-dev/skiff/sandboxd/internal/envdclient"
	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/prepared"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/snapshot"
	"github.com/skiff-dev/skiff/sandboxd/internal/stats"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/sandboxd/internal/volume"
	"github.com/skiff-dev/skiff/shared/egress"
	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/wire"
)

// Config is what the service is told: the host's name and capacity, the
// envd its sandboxes run, and the bounds and defaults of a sandbox.
type Config struct {
	// NodeName names the host; the tag in its sandbox IDs derives from it.
	NodeName string
	// Limits are the registry's limits (the capacity times the
	// overcommit), which Info and the metrics report.
	Limits registry.Limits

	// Envd is the static envd binary every sandbox runs as its init.
	Envd string
	// EnvdReadyTimeout bounds how long a new sandbox's envd may take to
	// answer /health.
	EnvdReadyTimeout time.Duration
	// PreparedSandboxes is how many sandboxes are kept prepared for cold
	// creates, per template (package prepared); 0 turns it off.
	PreparedSandboxes int
	// MaxTimeout bounds a sandbox's lifetime.
	MaxTimeout time.Duration
	// SnapshotMemory keeps a sandbox's memory and processes in its
	// snapshots and forks when the runtime can (sandboxrt.StateCapturer).
	SnapshotMemory bool

	// DefaultCPUMilli, DefaultMemoryMiB and DefaultDiskMiB are a sandbox's
	// resources when the request leaves them 0.
	DefaultCPUMilli  int64
	DefaultMemoryMiB int64
	DefaultDiskMiB   int64

	// MetricsInterval is how often every running sandbox's resource use is
	// sampled; MetricsSamples how many samples each keeps.
	MetricsInterval time.Duration
	MetricsSamples  int

	// DiskReserveMiB is the free space (as df's Avail) that the state
	// directory's and the volume store's filesystems keep: what would
	// write more there (a create, a snapshot, a fork, a pull, a pause to
	// disk, a volume) is refused with resource_exhausted below it, so
	// that the apiserver places it on another host. 0 turns it off.
	DiskReserveMiB int64
	// DiskCheckInterval is how often Run measures those filesystems, to
	// announce a change of pressure (Info's disk_pressure) on Watch;
	// default 10 s.
	DiskCheckInterval time.Duration
}

// Network gives each sandbox its network namespace: a veth pair on its
// address block and, unless denied, a route out.
type Network interface {
	// Setup prepares the sandbox's namespace and returns its path.
	Setup(ctx context.Context, id string, b ipam.Block, allowInternet bool) (netnsPath string, err error)
	// Teardown removes what Setup made; tearing down what is not there is
	// not an error. b is the zero Block for an orphan found by List, whose
	// block sandboxd no longer knows.
	Teardown(ctx context.Context, id string, b ipam.Block) error
	// List returns the IDs of every sandbox that has a namespace.
	List() ([]string, error)
	// ResolvConf is the /etc/resolv.conf every sandbox gets.
	ResolvConf() []byte
	// SetPolicy applies a set-up sandbox's outbound rules (internet is its
	// access when the rules refuse nothing).
	SetPolicy(id string, b ipam.Block, internet bool, r egress.Rules) error
}

// Envd reaches the envd in each sandbox, at addr (host:port).
type Envd interface {
	// WaitHealthy returns nil once envd answers, or an error after timeout.
	WaitHealthy(ctx context.Context, addr string, timeout time.Duration) error
	// Init posts in to /init, authenticated by the token envd holds now
	// ("" before the first /init), and returns envd's version.
	Init(ctx context.Context, addr, currentToken string, in *wire.EnvdInit) (version string, err error)
	// WriteFile writes content to path inside the sandbox as root.
	WriteFile(ctx context.Context, addr, token, path string, content []byte) error
}

// Templates are the root filesystems sandboxes start from.
type Templates interface {
	// Get returns a template's current version, or an error wrapping
	// fs.ErrNotExist when the host does not have it.
	Get(name string) (*template.Template, error)
	List() ([]*template.Template, error)
}

// Deps are what the service works with. Runtime, Network, Templates,
// Registry, IPAM and LogDir are required.
type Deps struct {
	Runtime   sandboxrt.Runtime
	Network   Network
	Templates Templates
	Registry  *registry.Registry
	IPAM      *ipam.Pool
	// Snapshots keeps the host's snapshots; nil: Snapshot and Fork answer
	// unimplemented.
	Snapshots *snapshot.Store
	// LogDir holds each sandbox's envd log, <LogDir>/<id>.log
	// (<state-dir>/logs).
	LogDir string
	// StateDir is the directory whose filesystem holds the sandboxes'
	// disks, layers, logs and snapshots, which Config.DiskReserveMiB
	// keeps free space on; empty: not checked.
	StateDir string

	// Clock drives deadlines, timestamps and the metrics sampler; the
	// real clock by default.
	Clock clock.WithTickerAndDelayedExecution
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Envd reaches the envd in each sandbox; an envdclient.Client by
	// default.
	Envd Envd
	// EnvdAddr is where a sandbox's envd listens, by default its address
	// at port 49983.
	EnvdAddr func(ipam.Block) string
	// EnvdVersion is the version the envd binary advertises; by default
	// New asks the binary (envdclient.Version).
	EnvdVersion string
	// Peers is the client PullSnapshot fetches from other hosts with;
	// by default one that trusts the system's roots.
	Peers *http.Client
	// Egress tells the egress filters each restricted sandbox's rules;
	// nil when the host runs none (then only rules of addresses work).
	Egress *egressproxy.Sandboxes
	// Volumes keeps the host's volumes; nil: the volume calls answer
	// unimplemented and creates with volume mounts are refused.
	Volumes *volume.Store
}

// Service is sandboxd's API. Build it with New; Recover it before serving
// Handler, Run it while serving, and StopWatches and Close it after.
type Service struct {
	cfg         Config
	rt          sandboxrt.Runtime
	net         Network
	templates   Templates
	snapshots   *snapshot.Store
	reg         *registry.Registry
	ipam        *ipam.Pool
	logDir      string
	stateDir    string
	clock       clock.WithTickerAndDelayedExecution
	log         *slog.Logger
	envd        Envd
	envdAddr    func(ipam.Block) string
	envdVersion string
	tag         sandboxid.Tag

	deadlines *deadline.Scheduler
	locks     keyedMutex
	peers     *http.Client
	holds     holds
	// naming serialises a named snapshot's taking of its name (the old
	// holder found, the new record written, the old one deleted), so that
	// two snapshots given one name at once leave one holder.
	naming  sync.Mutex
	egress  *egressproxy.Sandboxes
	volumes *volume.Store
	// holding are the sandboxes that hold volume leases, from before
	// their first lease to their release: a starting sandbox has no
	// record yet, and its leases are live all the same.
	holding holdingSet
	// hostChanged wakes the Watch streams when what Info says changes.
	hostChanged broadcast
	samples     *stats.Sampler
	metrics     *metrics
	// pressure is the disk pressure last measured, which Info reports
	// and the Watch streams heard of (notePressure).
	pressureMu sync.Mutex
	pressure   diskPressure

	// watchSource is the registry's Watch; tests replace it.
	watchSource func() ([]*store.Record, <-chan registry.Event, func())

	// prepared holds sandboxes made ahead of cold creates, through
	// preparer; both nil when off.
	prepared *prepared.Pool
	preparer sandboxrt.Preparer

	// Watching sandboxes' inits (exits.go): the IDs watched, and the
	// watchers' context and group, which Close ends and waits.
	exitMu    sync.Mutex
	watching  map[string]struct{}
	exitCtx   context.Context
	stopExits context.CancelFunc
	exitWG    sync.WaitGroup

	recovered atomic.Bool
	// stopping closes on StopWatches, so Watch streams end.
	stopping chan struct{}
	stopOnce sync.Once
}

var _ sandboxdv1connect.SandboxdServiceHandler = (*Service)(nil)

// New checks deps, asks the envd binary its version (unless deps gives it)
// and returns the service.
func New(cfg Config, deps Deps) (*Service, error) {
	if deps.Runtime == nil || deps.Network == nil || deps.Templates == nil || deps.Registry == nil || deps.IPAM == nil || deps.LogDir == "" {
		return nil, errors.New("new service: Runtime, Network, Templates, Registry, IPAM and LogDir are required")
	}
	if err := os.MkdirAll(deps.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("create log directory: %w", err)
	}
	s := &Service{
		cfg: cfg, rt: deps.Runtime, net: deps.Network, templates: deps.Templates, snapshots: deps.Snapshots,
		reg: deps.Registry, ipam: deps.IPAM, logDir: deps.LogDir, stateDir: deps.StateDir,
		clock: deps.Clock, log: deps.Logger, envd: deps.Envd, envdAddr: deps.EnvdAddr,
		envdVersion: deps.EnvdVersion, tag: sandboxid.NodeTag(cfg.NodeName),
		stopping: make(chan struct{}),
		watching: map[string]struct{}{},
	}
	s.exitCtx, s.stopExits = context.WithCancel(context.Background())
	s.peers, s.egress, s.volumes = deps.Peers, deps.Egress, deps.Volumes
	if s.peers == nil {
		s.peers = &http.Client{Transport: &http.Transport{Proxy: nil, ForceAttemptHTTP2: true, ResponseHeaderTimeout: time.Minute}}
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if rt, ok := s.rt.(sandboxrt.Preparer); ok && cfg.PreparedSandboxes > 0 {
		s.preparer = rt
		s.prepared = prepared.New(preparer{s, rt}, cfg.PreparedSandboxes, s.log)
	}
	if s.envd == nil {
		s.envd = envdclient.New(max(cfg.EnvdReadyTimeout, envdclient.DefaultTimeout))
	}
	if s.envdAddr == nil {
		s.envdAddr = func(b ipam.Block) string {
			return net.JoinHostPort(b.Sandbox.String(), strconv.Itoa(routing.EnvdPort))
		}
	}
	if s.envdVersion == "" {
		v, err := envdclient.Version(context.Background(), cfg.Envd)
		if err != nil {
			return nil, fmt.Errorf("new service: %w", err)
		}
		s.envdVersion = v
	}
	s.watchSource = s.reg.Watch
	// Info reports the disk pressure from its first call on.
	s.pressure = s.measurePressure()
	s.deadlines = deadline.New(asyncClock{s.clock}, s.expire)
	s.samples = stats.New(s.rt, s.reg, s.clock, cfg.MetricsSamples, s.log)
	s.metrics = newMetrics(s)
	return s, nil
}

// Run samples the running sandboxes' resource use every MetricsInterval,
// and measures the host's free disk every DiskCheckInterval, until ctx
// ends. It does not wait for the disk's measure to end: a hung filesystem
// (a shared volume store on NFS) holds only that goroutine, not sandboxd's
// shutdown.
func (s *Service) Run(ctx context.Context) {
	go s.watchDisk(ctx, cmp.Or(s.cfg.DiskCheckInterval, 10*time.Second))
	s.samples.Run(ctx, s.cfg.MetricsInterval)
}

// StopWatches ends every Watch stream, and the ones yet to start at once:
// a server that shuts down calls it first, since a stream would hold its
// connection open.
func (s *Service) StopWatches() {
	s.stopOnce.Do(func() { close(s.stopping) })
}

// Close stops watching the sandboxes' inits, disarms the deadlines and
// removes the prepared sandboxes. Every sandbox keeps running: sandboxes
// are not sandboxd's children, and the next start re-adopts them.
// Prepared sandboxes are not sandboxes: they go (a sandboxd killed instead
// leaves them to the next one's sweep of orphans).
func (s *Service) Close(ctx context.Context) {
	s.stopExits()
	s.exitWG.Wait()
	s.deadlines.Stop()
	if s.prepared != nil {
		s.prepared.Close(ctx)
	}
}

// Healthy is nil once the records are re-adopted, while the registry
// answers and the log directory is there.
func (s *Service) Healthy() error {
	if !s.recovered.Load() {
		return errors.New("recovering sandboxes")
	}
	_ = s.reg.Usage() // hangs, and fails the probe, if the registry is stuck
	if _, err := os.Stat(s.logDir); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
}

// LogAttrs describe the service for the server's start line: node, tag,
// runtime and envd version.
func (s *Service) LogAttrs() []any {
	return []any{"node", s.cfg.NodeName, "tag", string(s.tag), "runtime", s.rt.Name(), "envd_version", s.envdVersion}
}

// asyncClock runs AfterFunc callbacks on their own goroutine, as the real
// clock does. A fake clock calls them while it holds its own lock, where a
// deadline's kill (which reads the clock) would deadlock.
type asyncClock struct {
	clock.WithDelayedExecution
}

func (c asyncClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.WithDelayedExecution.AfterFunc(d, func() { go f() })
}
