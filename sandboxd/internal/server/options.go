package server

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

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/selfexe"
	"github.com/skiff-dev/skiff/sandboxd/internal/service"
)

// DefaultEnvdPath is where packages install the static envd when it does
// not sit beside sandboxd's own binary.
const DefaultEnvdPath = "/usr/local/lib/skiff/envd"

// Options configures the daemon's API server and its sandboxes.
type Options struct {
	// Listen is the API and relay address (the NodeInventory endpoint).
	Listen string
	// AdminListen serves /metrics and /healthz; keep it off the network.
	AdminListen string
	// NodeName names the host; the tag in its sandbox IDs derives from it.
	NodeName string

	// AuthTokenFile holds the token every caller must present.
	AuthTokenFile string
	// TLSCert and TLSKey serve TLS; with ClientCA, callers must present a
	// certificate it signed (mTLS) and need no token.
	TLSCert  string
	TLSKey   string
	ClientCA string
	// InsecureNoAuth serves without any authentication, for development.
	InsecureNoAuth bool

	// MaxSandboxes, CPUCapacity (millicores) and MemoryCapacity (MiB) are
	// the host's capacity; Overcommit multiplies CPU and memory.
	MaxSandboxes   int
	CPUCapacity    int64
	MemoryCapacity int64
	Overcommit     float64

	// SandboxCIDR is the pool of the sandboxes' addresses, a /30 each.
	SandboxCIDR string

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

	// DefaultCPUMilli, DefaultMemoryMiB and DefaultDiskMiB are a sandbox's
	// resources when the request leaves them 0 (e2b: 2 vCPU, 512 MiB).
	DefaultCPUMilli  int64
	DefaultMemoryMiB int64
	DefaultDiskMiB   int64

	// MetricsInterval is how often every running sandbox's resource use is
	// sampled; MetricsSamples how many samples each keeps.
	MetricsInterval time.Duration
	MetricsSamples  int

	// ShutdownTimeout bounds the graceful stop of the listeners. Sandboxes
	// keep running through it: they are not sandboxd's children.
	ShutdownTimeout time.Duration
}

// NewOptions returns the defaults, sized from this host.
func NewOptions() Options {
	node, _ := os.Hostname()
	return Options{
		Listen:            ":27777",
		AdminListen:       "127.0.0.1:27778",
		NodeName:          node,
		MaxSandboxes:      256,
		CPUCapacity:       int64(runtime.NumCPU()) * 1000,
		MemoryCapacity:    hostMemoryMiB(),
		Overcommit:        1.0,
		SandboxCIDR:       "10.213.0.0/16",
		Envd:              defaultEnvd(),
		EnvdReadyTimeout:  10 * time.Second,
		PreparedSandboxes: 1,
		MaxTimeout:        24 * time.Hour,
		DefaultCPUMilli:   2000,
		DefaultMemoryMiB:  512,
		DefaultDiskMiB:    10240,
		MetricsInterval:   5 * time.Second,
		MetricsSamples:    120,
		ShutdownTimeout:   10 * time.Second,
	}
}

// AddFlags registers the flags, each defaulting to the field's value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "Address of the API and of the relay into sandbox ports.")
	fs.StringVar(&o.AdminListen, "admin-listen", o.AdminListen, "Address of /metrics (Prometheus) and /healthz.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "This host's name; the tag in its sandbox IDs derives from it.")
	fs.StringVar(&o.AuthTokenFile, "auth-token-file", o.AuthTokenFile, "File holding the token callers send as 'Authorization: Bearer' or 'Skiff-Node-Token'.")
	fs.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "Server certificate (PEM); serves TLS.")
	fs.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "Server private key (PEM).")
	fs.StringVar(&o.ClientCA, "client-ca", o.ClientCA, "CA bundle (PEM) that callers' certificates must chain to (mTLS); needs --tls-cert and --tls-key.")
	fs.BoolVar(&o.InsecureNoAuth, "insecure-no-auth", o.InsecureNoAuth, "Serve without authentication. Anyone who reaches --listen controls every sandbox: development only.")
	fs.IntVar(&o.MaxSandboxes, "max-sandboxes", o.MaxSandboxes, "Most sandboxes (running, paused and warm) this host holds.")
	fs.Int64Var(&o.CPUCapacity, "cpu-capacity", o.CPUCapacity, "CPU for sandboxes, in millicores (default: every CPU of the host).")
	fs.Int64Var(&o.MemoryCapacity, "memory-capacity", o.MemoryCapacity, "Memory for sandboxes, in MiB (default: the host's MemTotal).")
	fs.Float64Var(&o.Overcommit, "overcommit", o.Overcommit, "Ratio by which the sandboxes' CPU and memory may exceed the capacity.")
	fs.StringVar(&o.SandboxCIDR, "sandbox-cidr", o.SandboxCIDR, "IPv4 pool of sandbox addresses, a /30 per sandbox.")
	fs.StringVar(&o.Envd, "envd", o.Envd, "The static envd binary every sandbox runs (default: envd beside sandboxd, else "+DefaultEnvdPath+").")
	fs.DurationVar(&o.EnvdReadyTimeout, "envd-ready-timeout", o.EnvdReadyTimeout, "How long a new sandbox's envd may take to answer.")
	fs.IntVar(&o.PreparedSandboxes, "prepared-sandboxes", o.PreparedSandboxes, "Sandboxes kept prepared for cold creates, per template created from: network, root, cgroup, namespaces and seccomp "+
		"set up, envd not started (native runtime; 0: off).")
	fs.DurationVar(&o.MaxTimeout, "max-timeout", o.MaxTimeout, "Longest lifetime a sandbox may be given.")
	fs.Int64Var(&o.DefaultCPUMilli, "default-cpu", o.DefaultCPUMilli, "A sandbox's CPU, in millicores, when the request gives none.")
	fs.Int64Var(&o.DefaultMemoryMiB, "default-memory", o.DefaultMemoryMiB, "A sandbox's memory, in MiB, when the request gives none.")
	fs.Int64Var(&o.DefaultDiskMiB, "default-disk", o.DefaultDiskMiB, "A sandbox's writable disk, in MiB, when the request gives none.")
	fs.DurationVar(&o.MetricsInterval, "metrics-interval", o.MetricsInterval, "How often each running sandbox's CPU, memory and disk use is sampled.")
	fs.IntVar(&o.MetricsSamples, "metrics-samples", o.MetricsSamples, "How many samples of each sandbox are kept for the Metrics RPC.")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "How long open requests may take to finish on shutdown; sandboxes keep running.")
}

// Limits are the registry's limits: the capacity times the overcommit.
func (o *Options) Limits() registry.Limits {
	return registry.Limits{
		MaxSandboxes: o.MaxSandboxes,
		CPUMilli:     int64(math.Floor(float64(o.CPUCapacity) * o.Overcommit)),
		MemoryMiB:    int64(math.Floor(float64(o.MemoryCapacity) * o.Overcommit)),
	}
}

// ServiceConfig is the service's part of the options.
func (o *Options) ServiceConfig() service.Config {
	return service.Config{
		NodeName: o.NodeName, Limits: o.Limits(),
		Envd: o.Envd, EnvdReadyTimeout: o.EnvdReadyTimeout, PreparedSandboxes: o.PreparedSandboxes, MaxTimeout: o.MaxTimeout,
		DefaultCPUMilli: o.DefaultCPUMilli, DefaultMemoryMiB: o.DefaultMemoryMiB, DefaultDiskMiB: o.DefaultDiskMiB,
		MetricsInterval: o.MetricsInterval, MetricsSamples: o.MetricsSamples,
	}
}

// Validate reports every option that cannot work, naming its flag.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for flag, addr := range map[string]string{"--listen": o.Listen, "--admin-listen": o.AdminListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			add("%s %q: %w", flag, addr, err)
		}
	}
	if o.NodeName == "" {
		add("--node-name must not be empty")
	}
	errs = append(errs, o.validateAuth()...)
	if o.MaxSandboxes < 1 {
		add("--max-sandboxes must be at least 1, got %d", o.MaxSandboxes)
	}
	if o.CPUCapacity < 1 {
		add("--cpu-capacity must be positive, got %d", o.CPUCapacity)
	}
	if o.MemoryCapacity < 1 {
		add("--memory-capacity must be positive, got %d (is /proc/meminfo readable?)", o.MemoryCapacity)
	}
	if !(o.Overcommit > 0 && o.Overcommit <= 100) {
		add("--overcommit must be above 0 and at most 100, got %g", o.Overcommit)
	}
	errs = append(errs, o.validateCIDR()...)
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
	if o.DefaultDiskMiB < 0 || o.DefaultDiskMiB > service.MaxDiskMiB {
		add("--default-disk must be between 0 and %d MiB, got %d", service.MaxDiskMiB, o.DefaultDiskMiB)
	}
	if o.MetricsInterval <= 0 {
		add("--metrics-interval must be positive, got %s", o.MetricsInterval)
	}
	if o.MetricsSamples < 2 {
		add("--metrics-samples must be at least 2, got %d", o.MetricsSamples)
	}
	if o.ShutdownTimeout < 0 {
		add("--shutdown-timeout must not be negative, got %s", o.ShutdownTimeout)
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

// ReadToken reads the shared token from --auth-token-file; surrounding
// white space is not part of it. It returns "" without a token file.
func (o *Options) ReadToken() (string, error) {
	if o.AuthTokenFile == "" {
		return "", nil
	}
	data, err := os.ReadFile(o.AuthTokenFile)
	if err != nil {
		return "", fmt.Errorf("read --auth-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if len(tok) < 16 {
		return "", fmt.Errorf("--auth-token-file %s: the token must be at least 16 characters", o.AuthTokenFile)
	}
	return tok, nil
}

// defaultEnvd is envd beside sandboxd's own binary when there is one, else
// DefaultEnvdPath.
func defaultEnvd() string {
	if exe, err := selfexe.Path(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "envd")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return DefaultEnvdPath
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
