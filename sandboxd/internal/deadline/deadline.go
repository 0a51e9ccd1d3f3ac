// Package deadline fires when a sandbox's end time passes: sandboxd then
// kills the sandbox, or pauses it when auto-pause was asked. SetTimeout
// re-arms a deadline; a restarted sandboxd arms every deadline again from
// its records, and one that passed while it was down fires at once.
package deadline

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Scheduler calls its expire function once per armed deadline, on its own
// goroutine, when the deadline passes. It is safe for concurrent use.
type Scheduler struct {
	clock  clock.WithDelayedExecution
	expire func(id string)

	mu      sync.Mutex
	timers  map[string]*entry
	stopped bool
	running sync.WaitGroup // expire calls in flight
}

type entry struct {
	timer clock.Timer
	at    time.Time
}

// New returns a Scheduler that calls expire(id) when id's deadline passes.
func New(c clock.WithDelayedExecution, expire func(id string)) *Scheduler {
	return &Scheduler{clock: c, expire: expire, timers: map[string]*entry{}}
}

// Set arms (or re-arms) id's deadline at at. A deadline already past fires
// at once.
func (s *Scheduler) Set(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.cancelLocked(id)
	e := &entry{at: at}
	s.timers[id] = e
	d := at.Sub(s.clock.Now())
	if d <= 0 {
		e.timer = stopped{}
		go s.fire(id, e)
		return
	}
	e.timer = s.clock.AfterFunc(d, func() { s.fire(id, e) })
}

// stopped is the timer of a deadline that fires at once.
type stopped struct{}

func (stopped) C() <-chan time.Time      { return nil }
func (stopped) Stop() bool               { return false }
func (stopped) Reset(time.Duration) bool { return false }

// Cancel disarms id's deadline; it does nothing for an unknown id.
func (s *Scheduler) Cancel(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelLocked(id)
}

// Deadline returns id's armed deadline.
func (s *Scheduler) Deadline(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.timers[id]
	if !ok {
		return time.Time{}, false
	}
	return e.at, true
}

// Stop disarms every deadline and waits for expire calls in flight.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	s.stopped = true
	for id := range s.timers {
		s.cancelLocked(id)
	}
	s.mu.Unlock()
	s.running.Wait()
}

func (s *Scheduler) cancelLocked(id string) {
	if e, ok := s.timers[id]; ok {
		e.timer.Stop()
		delete(s.timers, id)
	}
}

// fire runs expire for e, unless e was re-armed or cancelled meanwhile (its
// timer may fire just as Set or Cancel replaces it).
func (s *Scheduler) fire(id string, e *entry) {
	s.mu.Lock()
	if s.stopped || s.timers[id] != e {
		s.mu.Unlock()
		return
	}
	delete(s.timers, id)
	s.running.Add(1)
	s.mu.Unlock()
	defer s.running.Done()
	s.expire(id)
}
