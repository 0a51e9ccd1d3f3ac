package publish

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Defaults of the publish cadence. The readers' stale window
// (--inventory-stale-after, 90 s) is three default intervals.
const (
	DefaultInterval    = 30 * time.Second
	DefaultMinInterval = 2 * time.Second
	// DefaultSandboxShards is how many NodeInventoryShards hold a host's
	// sandboxes: 125 each at 2,000.
	DefaultSandboxShards = 16
	// DefaultMaxChanges is how many changed sandboxes a publish carries in
	// the NodeInventory before they are folded into the shards.
	DefaultMaxChanges = 256
)

// FieldManager is the server-side-apply field manager that owns every field
// of a host's NodeInventory.
const FieldManager = "vk-sandbox"

// Options is the publish cadence.
type Options struct {
	// Interval is how often the inventory is applied, stamped with
	// publishedAt = now, even when nothing else changed.
	Interval time.Duration
	// MinInterval is the shortest time between two publishes: a change seen
	// on sandboxd's Watch stream is published at most this long after the
	// previous publish, changes in between coalescing into one write.
	MinInterval time.Duration
	// SandboxShards is how many NodeInventoryShard objects the host's
	// sandboxes are split into (KubeWriter); 0 keeps them in the
	// NodeInventory, for readers older than the shards.
	SandboxShards int
	// ShardFormat is how a shard holds its sandboxes.
	ShardFormat ShardFormat
	// MaxChanges is how many changed sandboxes (entries changed or added,
	// and IDs removed) the NodeInventory may carry in
	// spec.sandboxChanges before the publish folds them into the shards;
	// 0: every change rewrites the shards it touches. Only with packed
	// shards.
	MaxChanges int
	// ServerTime stamps publishedAt in the kube-apiserver's time
	// (shared/serverclock) rather than this host's when the two differ by
	// more than serverclock.Tolerance.
	ServerTime bool
}

// ShardFormat is how a NodeInventoryShard holds its sandboxes.
type ShardFormat string

const (
	// ShardsPacked holds them in spec.packed, one JSON string (a seventh
	// of the apiserver's CPU per write).
	ShardsPacked ShardFormat = "packed"
	// ShardsStructured holds them in spec.sandboxes, a list the apiserver
	// decodes and validates entry by entry; for readers older than
	// spec.packed.
	ShardsStructured ShardFormat = "structured"
)

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{Interval: DefaultInterval, MinInterval: DefaultMinInterval, SandboxShards: DefaultSandboxShards, ShardFormat: ShardsPacked, MaxChanges: DefaultMaxChanges, ServerTime: true}
}

// AddFlags registers --publish-interval, --publish-min-interval,
// --publish-sandbox-shards, --publish-shard-format, --publish-max-changes
// and --publish-server-time, defaulting to the current values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.Interval, "publish-interval", o.Interval,
		"How often the host's NodeInventory is applied with publishedAt = now, even when nothing else changed; at least 1s (publishedAt has whole seconds). "+
			"Readers drop a node whose stamp trails by more than their --inventory-stale-after (90s by default): keep that at least two intervals.")
	fs.DurationVar(&o.MinInterval, "publish-min-interval", o.MinInterval,
		"Shortest time between two publishes: a change on sandboxd's Watch stream is published at most this long after the previous publish, "+
			"changes in between coalescing into one write. Greater than 0 and at most --publish-interval.")
	fs.IntVar(&o.SandboxShards, "publish-sandbox-shards", o.SandboxShards,
		"How many NodeInventoryShard objects hold the host's sandboxes (0 to 64), so that the NodeInventory stamped every interval stays small and a change rewrites only the shards it touches. "+
			"Sandboxes that would pass a shard's bounds (4,096 of them, or 1 MiB as stored) go to twice as many shards until they fit, with a warning, until vk-sandbox restarts. "+
			"0 keeps the sandboxes in the NodeInventory itself: only for sandbox-apiservers and envd proxies older than the shards, which do not read them (upgrade those first).")
	fs.StringVar((*string)(&o.ShardFormat), "publish-shard-format", string(o.ShardFormat),
		"How a NodeInventoryShard holds its sandboxes: packed (spec.packed, one JSON string: a write costs kube-apiserver a seventh of the same entries as a list) or structured (spec.sandboxes, a list): "+
			"structured only for sandbox-apiservers and envd proxies older than spec.packed, which do not read it (upgrade those first).")
	fs.IntVar(&o.MaxChanges, "publish-max-changes", o.MaxChanges,
		"How many changed sandboxes (changed, added or removed) a publish may carry in the NodeInventory's spec.sandboxChanges before it folds them into the shards they belong to, "+
			"so that a change costs one write of the inventory rather than one of every shard it touches; a publish with nothing newer folds them too. 0 to 4096; only with packed shards. "+
			"0 rewrites the shards on every change: only for sandbox-apiservers and envd proxies older than spec.sandboxChanges, which do not read it (upgrade those first).")
	fs.BoolVar(&o.ServerTime, "publish-server-time", o.ServerTime,
		"Stamp publishedAt in the kube-apiserver's time when this host's clock is more than a second off it (learnt from the Date of its responses; warned about, and in skiff_vk_sandbox_clock_offset_seconds). "+
			"Readers compare the hosts' stamps with each other: a host whose clock runs behind the others by more than their --inventory-stale-after would never count as live. "+
			"false stamps this host's clock as it is.")
}

// Validate reports every option that cannot work, naming its flag.
func (o Options) Validate() error {
	var errs []error
	if o.Interval <= 0 {
		errs = append(errs, fmt.Errorf("--publish-interval must be greater than 0, got %s", o.Interval))
	}
	if o.MinInterval <= 0 {
		errs = append(errs, fmt.Errorf("--publish-min-interval must be greater than 0, got %s", o.MinInterval))
	}
	if o.Interval > 0 && o.MinInterval > o.Interval {
		errs = append(errs, fmt.Errorf("--publish-min-interval (%s) must not exceed --publish-interval (%s)", o.MinInterval, o.Interval))
	}
	if o.SandboxShards < 0 || o.SandboxShards > v1beta1.MaxInventoryShards {
		errs = append(errs, fmt.Errorf("--publish-sandbox-shards must be from 0 to %d, got %d", v1beta1.MaxInventoryShards, o.SandboxShards))
	}
	if o.ShardFormat != ShardsPacked && o.ShardFormat != ShardsStructured {
		errs = append(errs, fmt.Errorf("--publish-shard-format must be %s or %s, got %q", ShardsPacked, ShardsStructured, o.ShardFormat))
	}
	if o.MaxChanges < 0 || o.MaxChanges > v1beta1.MaxShardEntries {
		errs = append(errs, fmt.Errorf("--publish-max-changes must be from 0 to %d, got %d", v1beta1.MaxShardEntries, o.MaxChanges))
	}
	if o.Interval > 0 && o.Interval < time.Second {
		errs = append(errs, fmt.Errorf("--publish-interval must be at least 1s (publishedAt has whole seconds), got %s", o.Interval))
	}
	return errors.Join(errs...)
}
