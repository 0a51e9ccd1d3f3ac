package publish

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Defaults of the publish cadence. The readers' stale window
// (--inventory-stale-after, 90 s) is three default intervals.
const (
	DefaultInterval    = 30 * time.Second
	DefaultMinInterval = 2 * time.Second
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
}

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{Interval: DefaultInterval, MinInterval: DefaultMinInterval}
}

// AddFlags registers --publish-interval and --publish-min-interval,
// defaulting to the current values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.Interval, "publish-interval", o.Interval,
		"How often the host's NodeInventory is applied with publishedAt = now, even when nothing else changed; at least 1s (publishedAt has whole seconds). "+
			"Readers drop a node whose stamp trails by more than their --inventory-stale-after (90s by default): keep that at least two intervals.")
	fs.DurationVar(&o.MinInterval, "publish-min-interval", o.MinInterval,
		"Shortest time between two publishes: a change on sandboxd's Watch stream is published at most this long after the previous publish, "+
			"changes in between coalescing into one write. Greater than 0 and at most --publish-interval.")
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
	if o.Interval > 0 && o.Interval < time.Second {
		errs = append(errs, fmt.Errorf("--publish-interval must be at least 1s (publishedAt has whole seconds), got %s", o.Interval))
	}
	return errors.Join(errs...)
}
