package cli

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

// countingBackend holds created sandboxes per team; Create blocks until
// release is closed, so creates can be in flight together.
type countingBackend struct {
	e2bapi.Backend
	mu      sync.Mutex
	teams   map[string]int
	release chan struct{}
}

func (b *countingBackend) List(_ context.Context, team string, _ []e2bapi.State) ([]e2bapi.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return make([]e2bapi.Sandbox, b.teams[team]), nil
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
	l := limitTeams(b, 3)
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
	if limitTeams(b, 0) != e2bapi.Backend(b) {
		t.Error("a zero limit should not wrap the backend")
	}
}
