package cli

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

// countingBackend holds created sandboxes per team; Create blocks until
// release is closed, so creates can be in flight together.
type countingBackend struct {
	e2bapi.Backend
	mu      sync.Mutex
	teams   map[string]int
	forks   int // Fork calls that reached the backend
	release chan struct{}
	// afterList, when set, runs once after a List has read the team's
	// sandboxes and before it returns them.
	afterList func()
}

func (b *countingBackend) List(_ context.Context, team string, _ []e2bapi.State) ([]e2bapi.Sandbox, error) {
	b.mu.Lock()
	out, after := make([]e2bapi.Sandbox, b.teams[team]), b.afterList
	b.afterList = nil
	b.mu.Unlock()
	if after != nil {
		after()
	}
	return out, nil
}

// Fork adds count sandboxes to team, once release is closed; a source
// named "missing" is not found.
func (b *countingBackend) Fork(ctx context.Context, team, src string, count int, _ time.Duration) ([]e2bapi.ForkResult, error) {
	if src == "missing" {
		return nil, e2bapi.ErrNotFound
	}
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.teams[team] += count
	b.forks++
	out := make([]e2bapi.ForkResult, count)
	for i := range out {
		out[i].Sandbox = &e2bapi.Sandbox{}
	}
	return out, nil
}

func (b *countingBackend) Create(_ context.Context, team string, _ e2bapi.CreateParams) (*e2bapi.Sandbox, error) {
	<-b.release
	b.mu.Lock()
	defer b.mu.Unlock()
	b.teams[team]++
	return &e2bapi.Sandbox{}, nil
}

func TestTeamLimitCountsSandboxesAndCreatesInFlight(t *testing.T) {
	b := &countingBackend{teams: map[string]int{"a": 1}, release: make(chan struct{})}
	l := limitTeams(b, 3, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Go(func() {
			_, err := l.Create(context.Background(), "a", e2bapi.CreateParams{})
			errs <- err
		})
	}
	// Two fit beside the one team a has; the other eight are refused at
	// once, while the two are still in flight.
	var refused int
	for range 8 {
		if err := <-errs; !errors.Is(err, e2bapi.ErrRateLimited) {
			t.Fatalf("a create over the limit: %v", err)
		}
		refused++
	}
	close(b.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a create within the limit: %v", err)
		}
	}
	if b.teams["a"] != 3 || refused != 8 {
		t.Errorf("team a has %d sandboxes, %d refused", b.teams["a"], refused)
	}
	// Another team has its own limit.
	if _, err := l.Create(context.Background(), "b", e2bapi.CreateParams{}); err != nil {
		t.Errorf("team b: %v", err)
	}
	if limitTeams(b, 0, nil) != e2bapi.Backend(b) || limitTeams(b, 0, auth.NewRateLimiter(0, 5)) != e2bapi.Backend(b) {
		t.Error("no limits should not wrap the backend")
	}
}

// A fork of n counts as n sandboxes against the team's limit, in flight
// included, and takes n tokens from its create rate; a fork that does not
// fit whole is refused whole, before anything starts.
func TestTeamLimitCountsForks(t *testing.T) {
	b := &countingBackend{teams: map[string]int{"a": 2}, release: make(chan struct{})}
	l := limitTeams(b, 5, nil)

	// 2 + 4 > 5: refused whole, at once.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := l.Fork(ctx, "a", "src", 4, time.Minute)
	if !errors.Is(err, e2bapi.ErrRateLimited) || !strings.Contains(err.Error(), "a fork of 4 would pass its limit of 5") {
		t.Fatalf("a fork of 4 beside 2 sandboxes, limit 5: %v", err)
	}

	// A fork of 3 in flight fills the team: a create meanwhile is refused.
	done := make(chan error, 1)
	go func() {
		_, err := l.Fork(context.Background(), "a", "src", 3, time.Minute)
		done <- err
	}()
	tl := l.(*teamLimit)
	waitFor(t, "the fork of 3 to be in flight", func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		return tl.inFlight["a"] == 3
	})
	if _, err := l.Create(context.Background(), "a", e2bapi.CreateParams{}); !errors.Is(err, e2bapi.ErrRateLimited) {
		t.Fatalf("a create while a fork of 3 fills the team: %v", err)
	}
	close(b.release)
	if err := <-done; err != nil {
		t.Fatalf("a fork of 3 beside 2 sandboxes, limit 5: %v", err)
	}
	if b.teams["a"] != 5 || b.forks != 1 || len(tl.inFlight) != 0 {
		t.Fatalf("team a has %d sandboxes after %d forks reached the backend (in flight: %v), want 5 after 1", b.teams["a"], b.forks, tl.inFlight)
	}
	if _, err := l.Fork(context.Background(), "a", "src", 1, time.Minute); !errors.Is(err, e2bapi.ErrRateLimited) {
		t.Fatalf("a fork of a full team: %v", err)
	}
	// A fork of the limit or more could never fit beside its source: a
	// 400, as e2b's API answers it, not a 429 to retry.
	var invalid *e2bapi.InvalidError
	if _, err := l.Fork(context.Background(), "c", "src", 5, time.Minute); !errors.As(err, &invalid) ||
		err.Error() != "Count must be lower than the maximum number of concurrent sandboxes (5)" {
		t.Fatalf("a fork of 5 with a limit of 5: %v", err)
	}

	// The rate, with no limit on the number: tokens are taken all or
	// nothing, in the create path's words.
	b = &countingBackend{teams: map[string]int{}, release: make(chan struct{})}
	close(b.release)
	rl := auth.NewRateLimiter(1e-3, 6) // no refill within the test
	l = limitTeams(b, 0, rl)
	if _, err := l.Fork(context.Background(), "a", "src", 4, time.Minute); err != nil {
		t.Fatalf("a fork of 4 with 6 tokens: %v", err)
	}
	if _, err := l.Fork(context.Background(), "a", "src", 3, time.Minute); !errors.Is(err, e2bapi.ErrRateLimited) || err.Error() != createRateExhausted {
		t.Fatalf("a fork of 3 with 2 tokens left: %v", err)
	}
	if _, err := l.Fork(context.Background(), "a", "src", 2, time.Minute); err != nil {
		t.Fatalf("a fork of 2 with the 2 tokens a refused fork left: %v", err)
	}
	// More than the burst needs the whole burst: refused with one token
	// gone, taken from a full bucket.
	if _, err := l.Fork(context.Background(), "a", "src", 7, time.Minute); !errors.Is(err, e2bapi.ErrRateLimited) || !strings.Contains(err.Error(), "more than the team's create burst of 6") {
		t.Fatalf("a fork of 7 with a burst of 6 and no token: %v", err)
	}
	if _, err := l.Fork(context.Background(), "b", "src", 7, time.Minute); err != nil {
		t.Fatalf("a fork of 7 from a full burst of 6: %v", err)
	}
	if rl.Allow("b") {
		t.Fatal("a create allowed right after a fork past the burst")
	}
	// A fork that starts nothing gives its tokens back, debt included.
	if _, err := l.Fork(context.Background(), "c", "missing", 9, time.Minute); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Fatalf("a fork of a missing source: %v", err)
	}
	if !rl.AllowN("c", 6) {
		t.Fatal("the tokens of a fork that started nothing were kept")
	}
	if b.forks != 3 || b.teams["a"] != 6 || b.teams["b"] != 7 {
		t.Fatalf("%d forks reached the backend, %d and %d sandboxes; want the 3 that fit, 6 and 7 sandboxes", b.forks, b.teams["a"], b.teams["b"])
	}
}

// A fork that ends while another request reads the team's list is counted
// by that request whether or not its list saw the fork's sandboxes: before,
// it was in neither the list nor the forks in flight, and the team could
// pass its limit by a whole fork.
func TestTeamLimitCountsWhatEndsDuringAList(t *testing.T) {
	b := &countingBackend{teams: map[string]int{}, release: make(chan struct{})}
	l := limitTeams(b, 5, nil)
	first := make(chan error, 1)
	go func() {
		_, err := l.Fork(context.Background(), "a", "src", 3, time.Minute)
		first <- err
	}()
	tl := l.(*teamLimit)
	waitFor(t, "the first fork to be in flight", func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		return tl.inFlight["a"] == 3
	})
	b.mu.Lock()
	b.afterList = func() {
		close(b.release)
		if err := <-first; err != nil {
			t.Errorf("the first fork: %v", err)
		}
	}
	b.mu.Unlock()
	// Its list is read before the first fork's 3 sandboxes exist, which
	// are no longer in flight when it counts.
	if _, err := l.Fork(context.Background(), "a", "src", 3, time.Minute); !errors.Is(err, e2bapi.ErrRateLimited) {
		t.Fatalf("a fork of 3 beside a fork of 3 that ended during its list, limit 5: %v", err)
	}
	if b.teams["a"] != 3 {
		t.Fatalf("team a has %d sandboxes, want the first fork's 3", b.teams["a"])
	}
}
