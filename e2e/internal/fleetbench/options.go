package fleetbench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/publish"
)

// Options are a run's size, cadence and windows.
type Options struct {
	// Hosts, SandboxesPerHost and Teams size the fleet; every host has
	// sandboxes of every team.
	Hosts, SandboxesPerHost, Teams int
	// Interval is the hosts' publish interval; Window the readers' stale
	// window (0: three intervals, the real ratio).
	Interval, Window time.Duration
	// Steady is how long each measured phase (steady, churn) lasts.
	Steady time.Duration
	// Churn is the fraction of the fleet's sandboxes that change per
	// second in the churn phase, half creates and half kills.
	Churn float64
	// Shards is how many NodeInventoryShards each host's sandboxes are
	// split into (vk-sandbox --publish-sandbox-shards); 0: none.
	Shards int
	// ShardFormat is how they hold them (vk-sandbox
	// --publish-shard-format): packed or structured.
	ShardFormat string
	// MaxChanges is how many changed sandboxes a host's inventory carries
	// before they are folded into its shards (vk-sandbox
	// --publish-max-changes); 0: every change rewrites its shards.
	MaxChanges int
	// Creates is how many sandboxes the churn phase creates (and deletes)
	// through the e2b API, spread over the phase, to time placement.
	Creates int
	// Out, if set, is a file the results are appended to as JSON lines.
	Out string
	// Bin holds sandbox-apiserver and sandbox-envd-proxy.
	Bin string
	// LogDir receives every component's log; "" makes a new folder (kept).
	LogDir string
	// Timeout bounds the whole run.
	Timeout time.Duration
	// ProfileDir, if set, receives a CPU profile of sandbox-apiserver and
	// of sandbox-envd-proxy for each measured phase (their --enable-pprof).
	ProfileDir string
}

// NewOptions returns the defaults: the smaller fleet at the real
// cadence.
func NewOptions() *Options {
	bin := os.Getenv("SKIFF_BIN")
	if bin == "" {
		bin = "bin"
	}
	return &Options{
		Hosts: 50, SandboxesPerHost: 2000, Teams: 20,
		Interval: publish.DefaultInterval, Steady: 90 * time.Second, Churn: 0.01, Creates: 50, Shards: publish.DefaultSandboxShards, ShardFormat: string(publish.ShardsPacked), MaxChanges: publish.DefaultMaxChanges,
		Bin: bin, Timeout: 45 * time.Minute,
	}
}

// AddFlags registers the flags, each defaulting to the field's value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Hosts, "hosts", o.Hosts, "Simulated sandbox hosts, each publishing its NodeInventory; at least 2 (one dies in the last phase).")
	fs.IntVar(&o.SandboxesPerHost, "sandboxes-per-host", o.SandboxesPerHost, "Sandboxes each host starts with; at least --teams, at most 4096.")
	fs.IntVar(&o.Teams, "teams", o.Teams, "Teams (namespaces) the sandboxes belong to, in turn; the e2b list and create are timed as the first.")
	fs.DurationVar(&o.Interval, "interval", o.Interval, "The hosts' publish interval (vk-sandbox --publish-interval, and the readers' --inventory-publish-interval); at least 1s.")
	fs.DurationVar(&o.Window, "window", o.Window, "The readers' --inventory-stale-after; 0 is three --interval, the real ratio. At least two intervals.")
	fs.DurationVar(&o.Steady, "steady", o.Steady, "How long each measured phase lasts: steady (no change), then churn.")
	fs.Float64Var(&o.Churn, "churn", o.Churn, "Fraction of all sandboxes that change per second in the churn phase (creates and kills, alternately, on random hosts); 0 to 1.")
	fs.IntVar(&o.Shards, "shards", o.Shards, "NodeInventoryShards per host (vk-sandbox --publish-sandbox-shards); 0 keeps each host's sandboxes in its NodeInventory.")
	fs.StringVar(&o.ShardFormat, "shard-format", o.ShardFormat, "How the shards hold their sandboxes (vk-sandbox --publish-shard-format): packed or structured.")
	fs.IntVar(&o.MaxChanges, "max-changes", o.MaxChanges, "How many changed sandboxes a host's inventory carries before they are folded into its shards (vk-sandbox --publish-max-changes); 0 rewrites the shards on every change.")
	fs.IntVar(&o.Creates, "creates", o.Creates, "Creates (each deleted after) through sandbox-apiserver's e2b API in the churn phase, to time placement; at least 1.")
	fs.StringVar(&o.Out, "out", o.Out, "File the results are appended to, one JSON object a line (hosts, sandboxes, phase, metric, component, value, unit); empty: none.")
	fs.StringVar(&o.Bin, "bin", o.Bin, "Folder holding sandbox-apiserver and sandbox-envd-proxy (make build fills bin/); default $SKIFF_BIN, else bin.")
	fs.StringVar(&o.LogDir, "log-dir", o.LogDir, "Folder for every component's log; empty: a new folder in $TMPDIR, kept and named in the output.")
	fs.StringVar(&o.ProfileDir, "profile-dir", o.ProfileDir, "Folder for a CPU profile (go tool pprof) of sandbox-apiserver and sandbox-envd-proxy over each measured phase, <phase>-<program>.pprof; empty: none.")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "Longest the whole run may take; past it, it stops and cleans up.")
}

// Validate reports every option that cannot work, naming its flag.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Hosts < 2 || o.Hosts > 254*256 {
		add("--hosts must be from 2 to %d, got %d", 254*256, o.Hosts)
	}
	if o.Teams < 1 {
		add("--teams must be at least 1, got %d", o.Teams)
	}
	if o.SandboxesPerHost < o.Teams || o.SandboxesPerHost > 4096 {
		add("--sandboxes-per-host must be from --teams (%d) to 4096, got %d", o.Teams, o.SandboxesPerHost)
	}
	if o.Interval < time.Second {
		add("--interval must be at least 1s, got %s", o.Interval)
	}
	if o.Window != 0 && o.Window < 2*o.Interval {
		add("--window must be at least two --interval (%s), got %s", 2*o.Interval, o.Window)
	}
	if o.Steady <= 0 {
		add("--steady must be greater than 0, got %s", o.Steady)
	}
	if o.Shards < 0 || o.Shards > v1beta1.MaxInventoryShards {
		add("--shards must be from 0 to %d, got %d", v1beta1.MaxInventoryShards, o.Shards)
	}
	if o.MaxChanges < 0 || o.MaxChanges > v1beta1.MaxShardEntries {
		add("--max-changes must be from 0 to %d, got %d", v1beta1.MaxShardEntries, o.MaxChanges)
	}
	if f := publish.ShardFormat(o.ShardFormat); f != publish.ShardsPacked && f != publish.ShardsStructured {
		add("--shard-format must be %s or %s, got %q", publish.ShardsPacked, publish.ShardsStructured, o.ShardFormat)
	}
	if o.Churn < 0 || o.Churn > 1 {
		add("--churn must be from 0 to 1, got %g", o.Churn)
	}
	if o.Creates < 1 {
		add("--creates must be at least 1, got %d", o.Creates)
	}
	if o.Timeout <= 0 {
		add("--timeout must be greater than 0, got %s", o.Timeout)
	}
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			add("--profile-dir: %v", err)
		}
	}
	for _, b := range []string{"sandbox-apiserver", "sandbox-envd-proxy"} {
		if _, err := os.Stat(filepath.Join(o.Bin, b)); err != nil {
			add("--bin %s: no %s (make build fills bin/)", o.Bin, b)
		}
	}
	return errors.Join(errs...)
}

// window is the readers' stale window.
func (o *Options) window() time.Duration {
	if o.Window == 0 {
		return 3 * o.Interval
	}
	return o.Window
}

// minInterval is the hosts' --publish-min-interval: the real 2s, or half
// an interval shorter than 4s.
func (o *Options) minInterval() time.Duration {
	return min(publish.DefaultMinInterval, o.Interval/2)
}
