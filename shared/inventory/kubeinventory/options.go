package kubeinventory

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/utils/clock"
)

// DefaultStaleAfter is the default window: three publish intervals of 30 s.
const DefaultStaleAfter = 90 * time.Second

// Options configures a Source.
type Options struct {
	// StaleAfter is how far an inventory's publishedAt may trail the fleet's
	// reference before the node is dropped: exactly StaleAfter behind is
	// kept, anything more is dropped.
	StaleAfter time.Duration
	// Clock caps the reference at now; nil means the real clock.
	Clock clock.PassiveClock
}

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{StaleAfter: DefaultStaleAfter}
}

// AddFlags registers --inventory-stale-after, defaulting to the current value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.StaleAfter, "inventory-stale-after", o.StaleAfter,
		"With --inventory kube: drop a node from the fleet when its NodeInventory publishedAt trails the newest one (capped at now) by more than this; greater than 0. "+
			"Keep it at least two publish intervals of vk-sandbox (--publish-interval, 30s by default).")
}

// Validate reports options that cannot work, naming the flag.
func (o Options) Validate() error {
	if o.StaleAfter <= 0 {
		return fmt.Errorf("--inventory-stale-after must be greater than 0, got %s", o.StaleAfter)
	}
	return nil
}
