package cli

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

// createRateExhausted is what a team that creates faster than its rate is
// told, by a create (limitCreates) and by a fork alike.
const createRateExhausted = "too many sandboxes created: the team's create rate is exhausted, retry later"

// teamLimit caps each team's sandboxes (running and paused) at max: a
// create or fork beyond answers 429. Creates and forks still in flight
// count, so concurrent ones cannot overshoot on this replica. A fork of n
// also takes n tokens from the team's create rate, all or nothing: a
// create takes its one in limitCreates, before its body is read, but a
// fork's count is in its body.
type teamLimit struct {
	e2bapi.Backend
	max  int               // 0: no limit on the number
	rate *auth.RateLimiter // nil: no limit on the rate

	mu       sync.Mutex
	inFlight map[string]int
	// released counts, per team, the sandboxes that have left inFlight:
	// a reserve whose list was read meanwhile may not see them yet.
	released map[string]uint64
}

// limitTeams wraps b with the team limits: at most max sandboxes (0: no
// limit) and forks taking from rate (nil: no limit).
func limitTeams(b e2bapi.Backend, max int, rate *auth.RateLimiter) e2bapi.Backend {
	if rate != nil && rate.Burst() == 0 {
		rate = nil // no limit on the rate
	}
	if max <= 0 && rate == nil {
		return b
	}
	return &teamLimit{Backend: b, max: max, rate: rate, inFlight: map[string]int{}, released: map[string]uint64{}}
}

func (l *teamLimit) Create(ctx context.Context, team string, p e2bapi.CreateParams) (*e2bapi.Sandbox, error) {
	release, err := l.reserve(ctx, team, 1, "")
	if err != nil {
		return nil, err
	}
	defer release()
	return l.Backend.Create(ctx, team, p)
}

// Fork refuses the whole fork when its count would take the team past its
// sandboxes or its create rate: starting some of them would leave the
// caller to guess which.
func (l *teamLimit) Fork(ctx context.Context, team, id string, count int, timeout time.Duration) ([]e2bapi.ForkResult, error) {
	// The source counts as one of the team's: a fork of max or more could
	// never fit, so it is a 400 (e2b's rule and words), not a 429 to retry.
	if l.max > 0 && count >= l.max {
		return nil, e2bapi.Invalid("", "Count must be lower than the maximum number of concurrent sandboxes (%d)", l.max)
	}
	release, err := l.reserve(ctx, team, count, fmt.Sprintf("a fork of %d", count))
	if err != nil {
		return nil, err
	}
	defer release()
	giveBack := func() {}
	if l.rate != nil {
		var ok bool
		if ok, giveBack = l.rate.TakeN(team, count); !ok {
			if b := l.rate.Burst(); count > b {
				return nil, rateError(fmt.Sprintf("too many sandboxes created: a fork of %d, more than the team's create burst of %d, waits for the team's full burst", count, b))
			}
			return nil, rateError(createRateExhausted)
		}
	}
	results, err := l.Backend.Fork(ctx, team, id, count, timeout)
	// A fork that started nothing (its source not found, or paused; every
	// fork refused) gives its tokens back: a fork of 100 would otherwise
	// cost the team its creates for 20 s at the defaults.
	if err != nil || !slices.ContainsFunc(results, func(r e2bapi.ForkResult) bool { return r.Err == nil }) {
		giveBack()
	}
	return results, err
}

// reserve counts n more sandboxes of team in flight, or refuses them
// (ErrRateLimited) when the team's sandboxes, those in flight included,
// leave no room for n; what names them in the refusal ("a fork of 3"),
// empty for one create. release uncounts them.
func (l *teamLimit) reserve(ctx context.Context, team string, n int, what string) (release func(), err error) {
	if l.max <= 0 {
		return func() {}, nil
	}
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		before := l.released[team]
		l.mu.Unlock()
		have, err := l.List(ctx, team, []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused})
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		// What finished while the list was read may be in it or not: it
		// left inFlight, so it counts here, unless a list read after
		// it says there is room.
		late := int(l.released[team] - before)
		taken := len(have) + l.inFlight[team]
		if taken+late+n > l.max {
			l.mu.Unlock()
			if late > 0 && attempt < 2 {
				continue
			}
			if what == "" {
				return nil, fmt.Errorf("%w: the team has %d sandboxes, its limit", e2bapi.ErrRateLimited, l.max)
			}
			return nil, fmt.Errorf("%w: the team has %d sandboxes (creates and forks in flight counted), and %s would pass its limit of %d",
				e2bapi.ErrRateLimited, taken+late, what, l.max)
		}
		l.inFlight[team] += n
		l.mu.Unlock()
		return func() {
			l.mu.Lock()
			if l.inFlight[team] -= n; l.inFlight[team] <= 0 {
				delete(l.inFlight, team)
			}
			l.released[team] += uint64(n)
			l.mu.Unlock()
		}, nil
	}
}

// Healthy passes the backend's health check through the wrapper.
func (l *teamLimit) Healthy(ctx context.Context) error {
	if h, ok := l.Backend.(e2bapi.HealthChecker); ok {
		return h.Healthy(ctx)
	}
	return nil
}

// rateError is a refusal by the create rate: an ErrRateLimited whose text
// is the caller's whole message, as limitCreates writes it for a create.
type rateError string

func (e rateError) Error() string { return string(e) }

// Is makes a rateError an ErrRateLimited.
func (e rateError) Is(target error) bool { return target == e2bapi.ErrRateLimited }
