package fleetsim

import (
	"context"
	"math/rand/v2"
	"time"
)

// churnTick is how often Churn makes the changes it owes.
const churnTick = 50 * time.Millisecond

// ChurnStats is what a Churn did.
type ChurnStats struct {
	// Created and Killed count the sandboxes started and killed; Full the
	// starts a full host refused.
	Created, Killed, Full int
	// Took is how long it ran.
	Took time.Duration
}

// Churn changes sandboxes on the running hosts, perSecond changes a
// second in all, until ctx ends: alternately it kills a sandbox of a host
// picked at random and starts one (of a team picked at random) on another
// picked at random, so that the fleet keeps its size. Each change reaches
// its host's Watch stream, and so its mirror and publisher, as a create or
// a kill on a real host would.
func (f *Fleet) Churn(ctx context.Context, perSecond float64) ChurnStats {
	var st ChurnStats
	start := time.Now()
	t := time.NewTicker(churnTick)
	defer t.Stop()
	owed, last, kill := 0.0, start, true
	for {
		select {
		case <-ctx.Done():
			st.Took = time.Since(start)
			return st
		case now := <-t.C:
			owed += perSecond * now.Sub(last).Seconds()
			last = now
		}
		for ; owed >= 1; owed-- {
			h := f.randomRunning()
			if h == nil {
				continue
			}
			if kill {
				if h.sd.RemoveRandom() != "" {
					st.Killed++
				}
			} else {
				team := f.cfg.Teams[rand.IntN(len(f.cfg.Teams))]
				if _, err := h.sd.Start(f.spec(h.Name(), team, time.Now())); err != nil {
					st.Full++
				} else {
					st.Created++
				}
			}
			kill = !kill
		}
	}
}

// randomRunning picks a running host at random; nil when none runs.
func (f *Fleet) randomRunning() *Host {
	for range 2 * len(f.hosts) {
		if h := f.hosts[rand.IntN(len(f.hosts))]; h.Running() {
			return h
		}
	}
	for _, h := range f.hosts {
		if h.Running() {
			return h
		}
	}
	return nil
}
