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

// teamBucket is one team's tokens, counted as x/time/rate's Limiter counts
// them (the same answers), but below zero for a debt, and with tokens that
// can be given back, which a rate.Limiter cannot take once their time has
// passed.
type teamBucket struct {
	tokens float64   // at at
	at     time.Time // when tokens was counted
	last   time.Time // last use, or when a debt is paid; for the sweep
}

// tokensAt is b's tokens at t: refilled at the rate, at most the burst.
func (l *RateLimiter) tokensAt(b *teamBucket, t time.Time) float64 {
	at := b.at
	if t.Before(at) {
		at = t
	}
	return min(b.tokens+t.Sub(at).Seconds()*float64(l.limit), float64(l.burst))
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
	ok, _ := l.TakeN(team, n)
	return ok
}

// TakeN is AllowN that can be undone: when ok, giveBack returns the tokens
// taken (at most a full burst), for what they paid for that did not happen
// (a fork whose source is not found).
func (l *RateLimiter) TakeN(team string, n int) (ok bool, giveBack func()) {
	if l.limit == rate.Inf || n <= 0 {
		return true, func() {}
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.teams[team]
	if b == nil {
		b = &teamBucket{tokens: float64(l.burst), at: now}
		l.teams[team] = b
	}
	// A bucket in debt is full again later than idle after its last use:
	// last is then that later moment, and stays so.
	b.last = later(b.last, now)
	tokens := l.tokensAt(b, now)
	if tokens < float64(min(n, l.burst)) {
		return false, nil
	}
	b.tokens, b.at = tokens-float64(n), now
	if debt := -b.tokens; debt > 0 {
		b.last = later(b.last, now.Add(time.Duration(debt/float64(l.limit)*float64(time.Second))))
	}
	var once sync.Once
	return true, func() {
		once.Do(func() {
			at := l.now()
			l.mu.Lock()
			defer l.mu.Unlock()
			if b := l.teams[team]; b != nil {
				b.tokens, b.at = min(l.tokensAt(b, at)+float64(n), float64(l.burst)), later(b.at, at)
			}
		})
	}
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
