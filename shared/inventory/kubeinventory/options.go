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
	// PublishInterval is how often the hosts publish (vk-sandbox's
	// --publish-interval): after a jump of the reference (a recovery, see
	// the package doc) the nodes fresh before it keep their place this long:
	// until the reference has moved this far past it, or the reader's clock
	// this far past seeing it, whichever comes first. Zero is a third of
	// StaleAfter (vk-sandbox's default 30 s with the default window).
	PublishInterval time.Duration
	// Clock caps the reference at now; nil means the real clock.
	Clock clock.PassiveClock
	// Local measures the recovery's PublishInterval on the reader's own
	// clock (with its monotonic reading); nil means Clock, or the real
	// clock when Clock corrects itself (shared/serverclock's, whose
	// corrections would move the recovery's end).
	Local clock.PassiveClock
	// ServerTime makes fleetsource.OpenKube give the Source a Clock in
	// the kube-apiserver's time (shared/serverclock), learnt from its
	// informers' answers, when Clock is nil (and the real clock as
	// Local).
	ServerTime bool
}

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{StaleAfter: DefaultStaleAfter, ServerTime: true}
}

// AddFlags registers --inventory-stale-after, --inventory-publish-interval
// and --inventory-server-time, defaulting to the current values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.StaleAfter, "inventory-stale-after", o.StaleAfter,
		"With --inventory kube: drop a node from the fleet when its NodeInventory publishedAt trails the newest one (capped at now) by more than this; greater than 0. "+
			"Keep it at least two publish intervals of vk-sandbox (--publish-interval, 30s by default).")
	fs.DurationVar(&o.PublishInterval, "inventory-publish-interval", o.PublishInterval,
		"With --inventory kube: how often the hosts publish their NodeInventory (vk-sandbox's --publish-interval). "+
			"After an outage longer than --inventory-stale-after, the hosts fresh before it keep their place this long after the first publish this reader sees "+
			"while they publish again, instead of leaving at that publish; a host dead through the outage leaves then. At most --inventory-stale-after; 0 is a third of it (30s by default).")
	fs.BoolVar(&o.ServerTime, "inventory-server-time", o.ServerTime,
		"With --inventory kube: cap the newest publishedAt by the kube-apiserver's time rather than this process's clock when the two differ by more than a second "+
			"(learnt from the Date of its responses, and warned about), as vk-sandbox stamps it (its --publish-server-time): a reader whose clock runs behind would keep a dead host that much longer. "+
			"false caps it by this process's clock as it is.")
}

// Validate reports options that cannot work, naming the flag.
func (o Options) Validate() error {
	if o.StaleAfter <= 0 {
		return fmt.Errorf("--inventory-stale-after must be greater than 0, got %s", o.StaleAfter)
	}
	if o.PublishInterval < 0 {
		return fmt.Errorf("--inventory-publish-interval must not be negative, got %s", o.PublishInterval)
	}
	if o.PublishInterval > o.StaleAfter {
		return fmt.Errorf("--inventory-publish-interval (%s) must not exceed --inventory-stale-after (%s)", o.PublishInterval, o.StaleAfter)
	}
	return nil
}
