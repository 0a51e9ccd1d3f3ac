package auth

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimiter is a token bucket per team: each team may create burst
// sandboxes at once, and perSecond a second after that. A 429 from the
// caller when Allow says no reaches the SDK as RateLimitError.
//
// Memory stays bounded by the teams active lately: a team's bucket is dropped
// once it has been idle long enough to have refilled, when a fresh bucket
// would behave exactly the same, so dropping it never grants a team more.
type RateLimiter struct {
	limit rate.Limit
	burst int
	// idle is how long an untouched bucket takes to refill.
	idle time.Duration
	now  func() time.Time

	mu        sync.Mutex
	teams     map[string]*teamBucket
	lastSweep time.Time
}

type teamBucket struct {
	lim  *rate.Limiter
	last time.Time
}

// NewRateLimiter returns a limiter allowing each team perSecond events a
// second with bursts of burst (at least 1). perSecond <= 0, +Inf or NaN means
// no limit.
func NewRateLimiter(perSecond float64, burst int) *RateLimiter {
	l := &RateLimiter{limit: rate.Inf, burst: max(burst, 1), now: time.Now, teams: map[string]*teamBucket{}}
	if perSecond > 0 && !math.IsInf(perSecond, 1) && !math.IsNaN(perSecond) {
		l.limit = rate.Limit(perSecond)
		// Round up, and add a margin for the limiter's own float arithmetic:
		// dropping a bucket a moment early would hand out a token early.
		refill := math.Ceil(float64(l.burst)/perSecond*float64(time.Second)) + float64(time.Millisecond)
		if refill >= math.MaxInt64 {
			l.idle = math.MaxInt64 // a bucket that never refills is never dropped
		} else {
			l.idle = time.Duration(refill)
		}
	}
	return l
}

// Allow takes one token from team's bucket and reports whether there was one.
func (l *RateLimiter) Allow(team string) bool { return l.AllowN(team, 1) }

// AllowN takes n tokens from team's bucket, all or nothing: when fewer are
// there, it takes none and reports false. A fork of n sandboxes takes n,
// as n creates would. More than the burst is allowed only from a full
// bucket, and leaves the rest as a debt: the team's next create waits until
// the rate has paid it, so that the average stays the rate.
func (l *RateLimiter) AllowN(team string, n int) bool {
	if l.limit == rate.Inf || n <= 0 {
		return true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.teams[team]
	if b == nil {
		b = &teamBucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.teams[team] = b
	}
	// A bucket in debt is full again later than idle after its last use:
	// last is then that later moment, and stays so.
	b.last = later(b.last, now)
	if n <= l.burst {
		return b.lim.AllowN(now, n)
	}
	if b.lim.TokensAt(now) < float64(l.burst) {
		return false
	}
	for left := n; left > 0; left -= l.burst {
		// A reservation within the burst always succeeds, leaving the
		// tokens below zero; nobody waits on it.
		b.lim.ReserveN(now, min(left, l.burst))
	}
	debt := time.Duration(float64(n-l.burst) / float64(l.limit) * float64(time.Second))
	b.last = later(b.last, now.Add(debt))
	return true
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Burst is the most tokens a team's bucket holds; more than that is allowed
// at once only from a full bucket (AllowN). 0 when there is no limit.
func (l *RateLimiter) Burst() int {
	if l.limit == rate.Inf {
		return 0
	}
	return l.burst
}

// sweep drops the buckets idle long enough to be full again. It runs at most
// once per refill time, so its cost spreads over the calls in between.
func (l *RateLimiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < l.idle {
		return
	}
	l.lastSweep = now
	for team, b := range l.teams {
		if now.Sub(b.last) >= l.idle {
			delete(l.teams, team)
		}
	}
}
