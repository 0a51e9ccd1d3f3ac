package publish

import "time"

// outcome is how one publish attempt ended.
type outcome int

const (
	// written: the inventory was applied, stamped now.
	written outcome = iota
	// unchanged: nothing but the stamp would change and the stamp is not
	// due yet, so nothing was written (diff before write).
	unchanged
	// notSynced: the mirror of sandboxd is not in sync; nothing was
	// written, so the stamp ages and readers drop the node after their
	// window.
	notSynced
	// failed: the apply failed.
	failed
)

// String is the outcome as a metric label.
func (o outcome) String() string {
	switch o {
	case written:
		return "written"
	case unchanged:
		return "unchanged"
	case notSynced:
		return "not_synced"
	default:
		return "failed"
	}
}

// schedule decides when the applier attempts a publish and whether an
// attempt writes. It is pure: the applier feeds it the time.
//
// The stamp is due Interval after the last write, whatever happened in
// between; a change is published MinInterval after the previous attempt at
// the earliest, so a burst of changes is one write. A failed apply backs off
// from MinInterval up to Interval; a mirror out of sync is tried again after
// an Interval or as soon as it changes (regaining sync is a change).
type schedule struct {
	opts        Options
	lastWrite   time.Time // zero: nothing written by this process yet
	lastAttempt time.Time
	pending     bool      // a change arrived since the last attempt
	retryAt     time.Time // not before this, after a failure
	backoff     time.Duration
}

func newSchedule(opts Options) *schedule {
	return &schedule{opts: opts, backoff: opts.MinInterval}
}

// changed records a change seen on the Watch stream.
func (s *schedule) changed() { s.pending = true }

// stampDue is when the stamp must be written again.
func (s *schedule) stampDue() time.Time {
	if s.lastWrite.IsZero() {
		return time.Time{}
	}
	return s.lastWrite.Add(s.opts.Interval)
}

// next is when the next attempt should run.
func (s *schedule) next() time.Time {
	at := s.stampDue()
	if s.retryAt.After(at) {
		at = s.retryAt
	}
	if s.pending {
		change := s.lastAttempt.Add(s.opts.MinInterval)
		if s.lastAttempt.IsZero() {
			change = time.Time{}
		}
		if change.Before(at) {
			at = change
		}
	}
	return at
}

// shouldWrite reports whether an attempt at now writes: the spec differs
// from the one last written, or the stamp is due.
func (s *schedule) shouldWrite(now time.Time, specChanged bool) bool {
	return specChanged || s.lastWrite.IsZero() || !now.Before(s.stampDue())
}

// done records the outcome of the attempt made at now.
func (s *schedule) done(now time.Time, o outcome) {
	s.lastAttempt, s.pending = now, false
	switch o {
	case written:
		s.lastWrite, s.retryAt, s.backoff = now, time.Time{}, s.opts.MinInterval
	case notSynced:
		s.retryAt = now.Add(s.opts.Interval)
	case failed:
		s.retryAt = now.Add(s.backoff)
		s.backoff = min(2*s.backoff, s.opts.Interval)
	case unchanged:
	}
}
