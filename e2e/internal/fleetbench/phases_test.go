package fleetbench

import (
	"context"
	"errors"
	"testing"
	"time"
)

// pastDeadline is a context whose deadline has passed while its timer has
// not yet fired: what a loaded machine shows for a while after a phase's
// end.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A probe cut at the phase's end is neither a time nor a failure, also when
// the call is refused for the deadline (client-go's rate limiter: "would
// exceed context deadline") before the context says it is done.
func TestProbeCutByTheDeadlineIsNoFailure(t *testing.T) {
	base, cancel := context.WithCancel(t.Context())
	defer cancel()
	calls := 0
	var l latencies
	probe(pastDeadline{base}, time.Millisecond, &l, func(context.Context) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return errors.New("client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline")
	})
	if calls != 1 || l.failed != 0 || len(l.took) != 0 {
		t.Errorf("the probe called %d times, with %d failures and %d times; want 1 call and neither", calls, l.failed, len(l.took))
	}
}
