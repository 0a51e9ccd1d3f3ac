package auth

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// fakeClock drives a RateLimiter without sleeping.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newFakeLimiter(perSecond float64, burst int) (*RateLimiter, *fakeClock) {
	c := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewRateLimiter(perSecond, burst)
	l.now = c.now
	return l, c
}

func allowed(l *RateLimiter, team string, n int) int {
	got := 0
	for range n {
		if l.Allow(team) {
			got++
		}
	}
	return got
}

func TestRateLimiterBurstAndRefill(t *testing.T) {
	l, clock := newFakeLimiter(2, 5) // 2/s, bursts of 5
	if got := allowed(l, "team-a", 10); got != 5 {
		t.Fatalf("first burst: %d allowed, want 5", got)
	}
	// Teams do not share a bucket.
	if got := allowed(l, "team-b", 10); got != 5 {
		t.Fatalf("team-b: %d allowed, want 5", got)
	}
	clock.advance(time.Second)
	if got := allowed(l, "team-a", 10); got != 2 {
		t.Fatalf("after 1s: %d allowed, want 2", got)
	}
	clock.advance(time.Hour)
	if got := allowed(l, "team-a", 10); got != 5 {
		t.Fatalf("after an hour: %d allowed, want a full burst of 5", got)
	}
}

func TestRateLimiterUnlimited(t *testing.T) {
	for _, r := range []float64{0, -1, math.Inf(1), math.NaN()} {
		l, _ := newFakeLimiter(r, 1)
		if got := allowed(l, "team-a", 1000); got != 1000 {
			t.Errorf("rate %v: %d of 1000 allowed, want all", r, got)
		}
		if len(l.teams) != 0 {
			t.Errorf("rate %v: %d buckets kept, want none", r, len(l.teams))
		}
	}
	if l := NewRateLimiter(1, 0); l.burst != 1 {
		t.Errorf("burst 0 became %d, want 1", l.burst)
	}
}

func TestRateLimiterEvictsIdleTeams(t *testing.T) {
	l, clock := newFakeLimiter(1, 2) // refills in 2s
	for i := range 1000 {
		l.Allow("team-" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	if len(l.teams) != 1000 {
		t.Fatalf("%d buckets, want 1000", len(l.teams))
	}
	clock.advance(time.Second)
	l.Allow("busy") // half refilled: nothing may go yet
	if len(l.teams) != 1001 {
		t.Fatalf("%d buckets after 1s, want 1001: a bucket was dropped before it refilled", len(l.teams))
	}
	clock.advance(2 * time.Second)
	l.Allow("busy")
	if len(l.teams) != 1 {
		t.Fatalf("%d buckets after the refill time, want only the busy one", len(l.teams))
	}
}

// Dropping idle buckets must not change a single answer: the limiter agrees
// with a plain token bucket that is never dropped, across waits shorter and
// longer than the refill time, while another team's calls keep sweeping.
func TestRateLimiterEvictionChangesNothing(t *testing.T) {
	l, clock := newFakeLimiter(10, 3) // refills in 300ms
	ref := rate.NewLimiter(10, 3)
	rng := rand.New(rand.NewPCG(1, 2)) // fixed: the test is deterministic
	for round := range 2000 {
		wait := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
		split := time.Duration(rng.Int64N(int64(wait) + 1))
		clock.advance(split)
		l.Allow("team-b")
		clock.advance(wait - split)
		for i := range 5 {
			got, want := l.Allow("team-a"), ref.AllowN(clock.now(), 1)
			if got != want {
				t.Fatalf("round %d (after %v), call %d: Allow = %v, a never-dropped bucket says %v", round, wait, i, got, want)
			}
		}
	}
}

func TestRateLimiterConcurrent(t *testing.T) {
	l := NewRateLimiter(1e-3, 50) // no refill within the test
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	for i := range 16 {
		team := []string{"team-a", "team-b"}[i%2]
		wg.Go(func() {
			n := allowed(l, team, 100)
			mu.Lock()
			got[team] += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if got["team-a"] != 50 || got["team-b"] != 50 {
		t.Fatalf("allowed %v, want exactly 50 per team", got)
	}
}

// AllowN takes n tokens or none: a request for more than the bucket holds
// leaves it as it was; more than the burst goes only from a full bucket,
// and leaves a debt the rate pays before the next.
func TestRateLimiterAllowNAllOrNothing(t *testing.T) {
	l, clock := newFakeLimiter(1, 5) // 1/s, bursts of 5
	if l.Burst() != 5 {
		t.Fatalf("Burst = %d, want 5", l.Burst())
	}
	if !l.AllowN("team-a", 3) {
		t.Fatal("3 of a full bucket of 5 refused")
	}
	if l.AllowN("team-a", 3) {
		t.Fatal("3 more allowed with 2 left")
	}
	// The refusal took nothing: the 2 left are still there.
	if got := allowed(l, "team-a", 5); got != 2 {
		t.Fatalf("after a refused AllowN(3): %d allowed, want the 2 left", got)
	}
	// More than the burst needs a full bucket, and leaves a debt.
	if !l.AllowN("team-b", 1) || l.AllowN("team-b", 6) {
		t.Fatal("6 allowed with a burst of 5 and 4 tokens")
	}
	if got := allowed(l, "team-b", 10); got != 4 {
		t.Fatalf("after a refused AllowN(6): %d allowed, want the 4 left", got)
	}
	clock.advance(5 * time.Second)
	if !l.AllowN("team-b", 8) {
		t.Fatal("8 refused from a full bucket of 5")
	}
	// 3 in debt at 1/s: the next token is there 4 s later, not before.
	clock.advance(3900 * time.Millisecond)
	if l.AllowN("team-b", 1) {
		t.Fatal("a create allowed before the fork's debt was paid")
	}
	clock.advance(200 * time.Millisecond)
	if !l.AllowN("team-b", 1) {
		t.Fatal("a create refused once the fork's debt was paid")
	}
	// The bucket is kept while in debt: dropped, it would start full.
	clock.advance(5 * time.Second)
	if !l.AllowN("team-c", 20) {
		t.Fatal("20 refused from team-c's full bucket")
	}
	clock.advance(6 * time.Second) // team-c: 15 in debt, 9 s to pay it
	_ = l.Allow("team-d")          // a sweep
	if l.AllowN("team-c", 1) {
		t.Fatal("team-c's bucket was dropped while in debt")
	}
	clock.advance(time.Hour)
	if !l.AllowN("team-a", 5) || l.AllowN("team-a", 1) {
		t.Fatal("a refilled bucket should give exactly its burst of 5")
	}
	// TakeN's giveBack returns what it took, debt included, once.
	clock.advance(time.Hour)
	ok, giveBack := l.TakeN("team-e", 9)
	if !ok || l.Allow("team-e") {
		t.Fatal("TakeN(9) from a full bucket refused, or left a token")
	}
	giveBack()
	giveBack()
	if got := allowed(l, "team-e", 10); got != 5 {
		t.Fatalf("after giveBack: %d allowed, want the full burst of 5", got)
	}
	if !l.AllowN("team-a", 0) {
		t.Error("AllowN(0) refused: nothing was asked")
	}
	u, _ := newFakeLimiter(0, 5)
	if !u.AllowN("team-a", 1000) || u.Burst() != 0 {
		t.Errorf("no limit: AllowN(1000) refused or Burst %d", u.Burst())
	}
}
