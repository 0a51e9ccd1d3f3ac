package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spf13/pflag"
)

// Defaults of Options.
const (
	// DefaultSampleSize is K, how many eligible nodes a cold create compares.
	DefaultSampleSize = 3
	// DefaultMaxAttempts bounds the creates of one placement.
	DefaultMaxAttempts = 3
	// DefaultClaimLimit is how many warm candidates Claim tries when its
	// caller asks for no particular number.
	DefaultClaimLimit = 3
	// DefaultMaxHold bounds how long a Placer goes on counting a sandbox it
	// placed (or was told of by Hold) against its node while the node's
	// inventory has not counted it yet.
	DefaultMaxHold = 30 * time.Second
)

// Options configures a Placer. The zero value of each field means its
// default, so Options{} works; NewOptions spells the defaults out for flags.
type Options struct {
	// SampleSize is K: how many eligible nodes a cold create samples and
	// compares. 1 is a uniformly random eligible node; a size of the fleet
	// or more is always the best one.
	SampleSize int
	// MaxAttempts bounds how many nodes one Place calls create on before it
	// gives up with ErrNoCapacity.
	MaxAttempts int
	// Retryable says whether a create's error means "try another node";
	// nil means IsRetryable.
	Retryable func(error) bool
	// ClaimRetryable says whether a claim's error means "try the next
	// candidate"; nil means IsClaimRetryable.
	ClaimRetryable func(error) bool
	// MaxHold bounds how long a placed (or held) sandbox is counted
	// against its node by this Placer, as a safety net: the count normally
	// ends at the node's first inventory that lists it (see Created).
	MaxHold time.Duration
	// Rand samples nodes and breaks ties, for reproducible tests; nil means
	// the process-wide source. The Placer serialises its use of it.
	Rand *rand.Rand
	// Now is the Placer's clock, for MaxHold; nil means time.Now.
	Now func() time.Time
}

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{SampleSize: DefaultSampleSize, MaxAttempts: DefaultMaxAttempts, MaxHold: DefaultMaxHold}
}

// AddFlags registers --placement-sample-size, --placement-max-attempts and
// --placement-max-hold, defaulting to the current values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.SampleSize, "placement-sample-size", o.SampleSize,
		"How many eligible nodes (fresh, with the template and room) a cold create samples at random; the freest of them after the request gets the sandbox. At least 1.")
	fs.IntVar(&o.MaxAttempts, "placement-max-attempts", o.MaxAttempts,
		"Most nodes one cold create tries when nodes refuse (full or unreachable) before answering 503 sandbox_capacity_unavailable. At least 1.")
	fs.DurationVar(&o.MaxHold, "placement-max-hold", o.MaxHold,
		"Longest this replica counts a sandbox it placed (or forked, or started from a snapshot on a host that holds it) against its host while the host's inventory may not count it yet, so that creates in a burst spread. The count normally ends at the host's first inventory that lists the sandbox, or when this replica kills it; this bounds it for a sandbox no inventory ever lists. At least 1s.")
}

// Validate reports options that cannot work, naming the flag.
func (o Options) Validate() error {
	var errs []error
	if o.SampleSize < 1 {
		errs = append(errs, fmt.Errorf("--placement-sample-size must be at least 1, got %d", o.SampleSize))
	}
	if o.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("--placement-max-attempts must be at least 1, got %d", o.MaxAttempts))
	}
	if o.MaxHold < time.Second {
		errs = append(errs, fmt.Errorf("--placement-max-hold must be at least 1s, got %s", o.MaxHold))
	}
	return errors.Join(errs...)
}
