package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
)

// validOptions are options that pass Validate: the defaults with a token
// file and the host's capacity fixed.
func validOptions() *Options {
	o := NewOptions()
	o.Global.StateDir = "/var/lib/skiff/sandboxd"
	o.NodeName = "test-node"
	o.AuthTokenFile = "/etc/skiff/token"
	o.CPUCapacity, o.MemoryCapacity = 4000, 8192
	o.Envd = "/usr/local/lib/skiff/envd"
	return o
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string // "" means valid
	}{
		{"defaults with a token", func(*Options) {}, ""},
		{"mTLS", func(o *Options) { o.AuthTokenFile, o.TLSCert, o.TLSKey, o.ClientCA = "", "c", "k", "ca" }, ""},
		{"token over TLS", func(o *Options) { o.TLSCert, o.TLSKey = "c", "k" }, ""},
		{"insecure", func(o *Options) { o.AuthTokenFile, o.InsecureNoAuth = "", true }, ""},
		{"gvisor", func(o *Options) { o.Runtime = "gvisor" }, ""},
		{"no state dir", func(o *Options) { o.Global.StateDir = "" }, "--state-dir"},
		{"bad log level", func(o *Options) { o.Log.Level = "loud" }, "--log-level"},
		{"bad log format", func(o *Options) { o.Log.Format = "xml" }, "--log-format"},
		{"no auth", func(o *Options) { o.AuthTokenFile = "" }, "--auth-token-file"},
		{"TLS without client CA or token", func(o *Options) { o.AuthTokenFile, o.TLSCert, o.TLSKey = "", "c", "k" }, "--insecure-no-auth"},
		{"insecure and token", func(o *Options) { o.InsecureNoAuth = true }, "conflicts"},
		{"cert without key", func(o *Options) { o.TLSCert = "c" }, "--tls-key"},
		{"client CA without cert", func(o *Options) { o.ClientCA = "ca" }, "--client-ca"},
		{"bad listen", func(o *Options) { o.Listen = "nope" }, "--listen"},
		{"bad admin listen", func(o *Options) { o.Admin.Listen = "" }, "--admin-listen"},
		{"no node name", func(o *Options) { o.NodeName = "" }, "--node-name"},
		{"negative shutdown timeout", func(o *Options) { o.Shutdown.Timeout = -time.Second }, "--shutdown-timeout"},
		{"no sandboxes", func(o *Options) { o.MaxSandboxes = 0 }, "--max-sandboxes"},
		{"no cpu", func(o *Options) { o.CPUCapacity = 0 }, "--cpu-capacity"},
		{"no memory", func(o *Options) { o.MemoryCapacity = -1 }, "--memory-capacity"},
		{"zero memory overcommit", func(o *Options) { o.MemoryOvercommit = 0 }, "--memory-overcommit"},
		{"huge memory overcommit", func(o *Options) { o.MemoryOvercommit = 1000 }, "--memory-overcommit"},
		{"negative cpu overcommit", func(o *Options) { o.CPUOvercommit = -1 }, "--cpu-overcommit"},
		{"huge cpu overcommit", func(o *Options) { o.CPUOvercommit = 101 }, "--cpu-overcommit"},
		{"bad cidr", func(o *Options) { o.SandboxCIDR = "10.0.0.0" }, "--sandbox-cidr"},
		{"ipv6 cidr", func(o *Options) { o.SandboxCIDR = "fd00::/64" }, "--sandbox-cidr"},
		{"cidr too small", func(o *Options) { o.SandboxCIDR, o.MaxSandboxes = "10.0.0.0/28", 8 }, "--max-sandboxes"},
		{"no envd", func(o *Options) { o.Envd = "" }, "--envd"},
		{"no ready timeout", func(o *Options) { o.EnvdReadyTimeout = 0 }, "--envd-ready-timeout"},
		{"too many prepared", func(o *Options) { o.PreparedSandboxes = 17 }, "--prepared-sandboxes"},
		{"no max timeout", func(o *Options) { o.MaxTimeout = -time.Second }, "--max-timeout"},
		{"tiny default cpu", func(o *Options) { o.DefaultCPUMilli = 1 }, "--default-cpu"},
		{"tiny default memory", func(o *Options) { o.DefaultMemoryMiB = 1 }, "--default-memory"},
		{"negative default disk", func(o *Options) { o.DefaultDiskMiB = -1 }, "--default-disk"},
		{"volume size below ext4's", func(o *Options) { o.VolumeSizeMiB = 8 }, "--volume-size"},
		{"shared volumes with a size", func(o *Options) { o.VolumeShared, o.VolumeDir = true, "/mnt/shared" }, "--volume-shared needs --volume-size 0"},
		{"shared volumes without a dir", func(o *Options) { o.VolumeShared, o.VolumeSizeMiB = true, 0 }, "--volume-shared needs --volume-dir"},
		{"no metrics interval", func(o *Options) { o.MetricsInterval = 0 }, "--metrics-interval"},
		{"a negative disk reserve", func(o *Options) { o.DiskReserveMiB = -1 }, "--disk-reserve must be between 0 and"},
		{"no team share", func(o *Options) { o.EgressTeamShare = 0 }, "--egress-team-share must be between 1 and 16"},
		{"a team share past a sandbox's", func(o *Options) { o.EgressTeamShare = 17 }, "--egress-team-share must be between 1 and 16"},
		{"one sample", func(o *Options) { o.MetricsSamples = 1 }, "--metrics-samples"},
		{"unknown runtime", func(o *Options) { o.Runtime = "kata" }, "--runtime"},
		{"gvisor without runsc", func(o *Options) { o.Runtime, o.Runsc = "gvisor", "" }, "--runsc"},
		{"no pids", func(o *Options) { o.PidsLimit = 0 }, "--pids-limit"},
		{"spare disks", func(o *Options) { o.SpareDisks = 65 }, "--spare-disks"},
		{"negative spare disks", func(o *Options) { o.SpareDisks = -1 }, "--spare-disks"},
		{"negative reserve", func(o *Options) { o.PidsReserve = -1 }, "--host-pids-reserve"},
		{"bad deny", func(o *Options) { o.DenyCIDRs = []string{"10.0.0.0/33"} }, "--deny-cidr"},
		{"ipv6 allow", func(o *Options) { o.AllowCIDRs = []string{"fd00::/8"} }, "--allow-cidr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := validOptions()
			tc.mod(o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestOptionsValidateReportsEvery: Validate joins every problem, not the
// first one only.
func TestOptionsValidateReportsEvery(t *testing.T) {
	o := validOptions()
	o.Listen, o.PidsLimit, o.Runtime = "nope", 0, "kata"
	err := o.Validate()
	for _, flag := range []string{"--listen", "--pids-limit", "--runtime"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("Validate = %v, want it to name %s", err, flag)
		}
	}
}

// By default CPU is not admitted and memory is, as it is; each has its own
// factor, and a later flag wins over the deprecated --overcommit.
func TestOvercommitFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want registry.Limits
	}{
		{nil, registry.Limits{MaxSandboxes: 256, CPUMilli: 4000, CPUShared: true, MemoryMiB: 8192}},
		{[]string{"--cpu-overcommit=2"}, registry.Limits{MaxSandboxes: 256, CPUMilli: 8000, MemoryMiB: 8192}},
		{[]string{"--memory-overcommit=2.5"}, registry.Limits{MaxSandboxes: 256, CPUMilli: 4000, CPUShared: true, MemoryMiB: 20480}},
		{[]string{"--overcommit=3", "--cpu-overcommit=0"}, registry.Limits{MaxSandboxes: 256, CPUMilli: 4000, CPUShared: true, MemoryMiB: 24576}},
	} {
		o := NewOptions()
		fs := pflag.NewFlagSet("sandboxd", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(append([]string{"--cpu-capacity=4000", "--memory-capacity=8192"}, c.args...)); err != nil {
			t.Fatal(err)
		}
		if got := o.Limits(); got != c.want {
			t.Errorf("%q: Limits = %+v, want %+v", c.args, got, c.want)
		}
	}
}

func TestOptionsFlags(t *testing.T) {
	o := NewOptions()
	if o.CPUCapacity != 0 || o.MemoryCapacity != 0 || o.NodeName != "" || o.Envd != "" {
		t.Fatalf("host-given defaults are set before Complete: %+v", o)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if o.CPUCapacity < 1000 || o.MemoryCapacity < 1 || o.NodeName == "" || o.Envd == "" {
		t.Fatalf("Complete left host-given defaults empty: %+v", o)
	}
	if o.Listen != ":27777" || o.Admin.Listen != "127.0.0.1:27778" ||
		o.DefaultCPUMilli != 2000 || o.DefaultMemoryMiB != 512 || o.EnvdReadyTimeout != 10*time.Second || o.MaxTimeout != 24*time.Hour ||
		o.Runtime != "native" || o.Runsc != "runsc" || o.RunscPlatform != "systrap" || o.Global.StateDir != DefaultStateDir || o.RunDir != DefaultRunDir {
		t.Fatalf("defaults = %+v", o)
	}
	fs := pflag.NewFlagSet("sandboxd", pflag.ContinueOnError)
	o.AddFlags(fs)
	o.Global.AddFlags(fs)
	if err := fs.Parse([]string{"--cpu-capacity=4000", "--memory-capacity=8192", "--overcommit=1.5", "--max-sandboxes=10", "--insecure-no-auth",
		"--runtime=gvisor", "--runsc=/opt/runsc", "--runsc-platform=ptrace", "--deny-cidr=192.0.2.0/24,198.51.100.0/24", "--state-dir=rel/state"}); err != nil {
		t.Fatal(err)
	}
	if got := o.Limits(); got != (registry.Limits{MaxSandboxes: 10, CPUMilli: 6000, MemoryMiB: 12288}) {
		t.Fatalf("Limits = %+v, want --overcommit on CPU and memory", got)
	}
	if !o.InsecureNoAuth || o.Runtime != "gvisor" || o.Runsc != "/opt/runsc" || o.RunscPlatform != "ptrace" || len(o.DenyCIDRs) != 2 {
		t.Fatalf("parsed = %+v", o)
	}
	if err := o.Complete(); err != nil || !filepath.IsAbs(o.Global.StateDir) || !strings.HasSuffix(o.Global.StateDir, "/rel/state") {
		t.Fatalf("Complete = %v, state dir %q", err, o.Global.StateDir)
	}
	if c := o.ServiceConfig(); c.Limits != o.Limits() || c.MaxTimeout != o.MaxTimeout {
		t.Fatalf("ServiceConfig = %+v", c)
	}
	if c := o.ServerConfig(); !c.InsecureNoAuth || c.Listen != o.Listen {
		t.Fatalf("ServerConfig = %+v", c)
	}
	if n := o.NetworkOptions(); len(n.Deny) != 2 || n.Pool.String() != o.SandboxCIDR {
		t.Fatalf("NetworkOptions = %+v", n)
	}
}

// TestServeFlags: every flag of `sandboxd serve` has help and the flags
// that docs/configuration.md is generated from are all there.
func TestServeFlags(t *testing.T) {
	cmd := NewCommand()
	serve, _, err := cmd.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	fs := serve.Flags()
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		n++
		if f.Usage == "" {
			t.Errorf("--%s has no help", f.Name)
		}
	})
	for _, name := range []string{
		"listen", "admin-listen", "node-name", "auth-token-file", "tls-cert", "tls-key", "client-ca", "insecure-no-auth", "shutdown-timeout",
		"max-sandboxes", "cpu-capacity", "memory-capacity", "cpu-overcommit", "memory-overcommit", "overcommit", "sandbox-cidr", "envd", "envd-ready-timeout", "prepared-sandboxes",
		"max-timeout", "default-cpu", "default-memory", "default-disk", "metrics-interval", "metrics-samples", "runtime", "runsc", "runsc-platform",
		"uid-base", "pids-limit", "host-pids-reserve", "cgroup-parent", "cgroup-favor-dynmods", "run-dir", "iface-prefix", "nft-table", "deny-cidr", "allow-cidr", "enable-pprof",
		"log-level", "log-format", "snapshot-memory", "peer-ca", "egress-proxy-port", "dns-filter-port", "resolv-conf",
		"volume-dir", "volume-shared", "volume-size", "init-binary", "go-init", "spare-disks", "disk-reserve", "egress-team-share",
	} {
		if fs.Lookup(name) == nil {
			t.Errorf("serve has no --%s", name)
		}
	}
	if serve.InheritedFlags().Lookup("state-dir") == nil {
		t.Error("serve does not inherit --state-dir")
	}
	if n != 54 {
		t.Errorf("serve has %d flags of its own, want 54: a new flag goes into this test and the docs", n)
	}
}

// The init binary: beside sandboxd's binary (the test binary has none),
// else installed, else sandboxd's own.
func TestInitBinaryDefault(t *testing.T) {
	installed := filepath.Join(t.TempDir(), "sandboxd-init")
	if got := besideOrInstalled("sandboxd-init", installed, OwnBinary); got != OwnBinary {
		t.Errorf("with none: %q, want %q", got, OwnBinary)
	}
	if err := os.WriteFile(installed, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := besideOrInstalled("sandboxd-init", installed, OwnBinary); got != installed {
		t.Errorf("with one installed: %q, want %q", got, installed)
	}
	if got := besideOrInstalled("sandboxd-init", filepath.Dir(installed), OwnBinary); got != OwnBinary {
		t.Errorf("with a directory installed: %q, want %q", got, OwnBinary)
	}
}

func TestParseMemTotal(t *testing.T) {
	if got := parseMemTotal([]byte("MemFree: 1 kB\nMemTotal:       24683620 kB\n")); got != 24683620/1024 {
		t.Fatalf("MemTotal = %d", got)
	}
	if got := parseMemTotal([]byte("garbage")); got != 0 {
		t.Fatalf("garbage = %d", got)
	}
}
