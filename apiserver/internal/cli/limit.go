package cli

import (
	"context"
	"fmt"
	"sync"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

// teamLimit caps each team's sandboxes (running and paused) at max: a
// create beyond answers 429. Creates still in flight count, so concurrent
// creates cannot overshoot on this replica.
type teamLimit struct {
	e2bapi.Backend
	max int

	mu       sync.Mutex
	inFlight map[string]int
}

func limitTeams(b e2bapi.Backend, max int) e2bapi.Backend {
	if max <= 0 {
		return b
	}
	return &teamLimit{Backend: b, max: max, inFlight: map[string]int{}}
}

func (l *teamLimit) Create(ctx context.Context, team string, p e2bapi.CreateParams) (*e2bapi.Sandbox, error) {
	have, err := l.List(ctx, team, []e2bapi.State{e2bapi.StateRunning, e2bapi.StatePaused})
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if len(have)+l.inFlight[team] >= l.max {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: the team has %d sandboxes, its limit", e2bapi.ErrRateLimited, l.max)
	}
	l.inFlight[team]++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.inFlight[team]--; l.inFlight[team] == 0 {
			delete(l.inFlight, team)
		}
		l.mu.Unlock()
	}()
	return l.Backend.Create(ctx, team, p)
}

// Healthy passes the backend's health check through the wrapper.
func (l *teamLimit) Healthy(ctx context.Context) error {
	if h, ok := l.Backend.(e2bapi.HealthChecker); ok {
		return h.Healthy(ctx)
	}
	return nil
}
