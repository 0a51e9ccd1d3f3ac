package publish

import (
	"strings"
	"testing"
	"time"
)

func TestSchedule(t *testing.T) {
	opts := Options{Interval: 30 * time.Second, MinInterval: 2 * time.Second}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0.Add
	type step struct {
		change  bool          // a change arrives first
		now     time.Duration // the attempt's time
		changed bool          // the spec differs from the last write
		outcome outcome       // what the attempt does (written is checked against shouldWrite)
		write   bool          // want shouldWrite
		next    time.Duration // want next() after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"the first attempt writes, then every interval", []step{
			{now: 0, changed: true, write: true, outcome: written, next: 30 * time.Second},
			{now: 30 * time.Second, write: true, outcome: written, next: 60 * time.Second},
		}},
		{"a change is published at most a min interval after the previous attempt", []step{
			{now: 0, changed: true, write: true, outcome: written, next: 30 * time.Second},
			{change: true, now: 2 * time.Second, changed: true, write: true, outcome: written, next: 32 * time.Second},
		}},
		{"a change that did not change the spec writes nothing and keeps the cadence", []step{
			{now: 0, changed: true, write: true, outcome: written, next: 30 * time.Second},
			{change: true, now: 5 * time.Second, write: false, outcome: unchanged, next: 30 * time.Second},
			{now: 30 * time.Second, write: true, outcome: written, next: 60 * time.Second},
		}},
		{"out of sync: retried after an interval, or at once when the mirror changes", []step{
			{now: 0, changed: true, write: true, outcome: written, next: 30 * time.Second},
			{now: 30 * time.Second, write: true, outcome: notSynced, next: 60 * time.Second},
			{change: true, now: 32 * time.Second, write: true, outcome: written, next: 62 * time.Second},
		}},
		{"a failed apply backs off from the min interval to the interval", []step{
			{now: 0, changed: true, write: true, outcome: failed, next: 2 * time.Second},
			{now: 2 * time.Second, changed: true, write: true, outcome: failed, next: 6 * time.Second},
			{now: 6 * time.Second, changed: true, write: true, outcome: failed, next: 14 * time.Second},
			{now: 14 * time.Second, changed: true, write: true, outcome: written, next: 44 * time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSchedule(opts)
			if !s.next().IsZero() {
				t.Fatalf("first next() = %v, want at once", s.next())
			}
			for i, st := range tt.steps {
				if st.change {
					s.changed()
					if want := s.lastAttempt.Add(opts.MinInterval); i > 0 && s.next().After(want) {
						t.Errorf("step %d: after a change next() = %v, want at most %v", i, s.next().Sub(t0), want.Sub(t0))
					}
				}
				if got := s.shouldWrite(at(st.now), st.changed); got != st.write {
					t.Errorf("step %d: shouldWrite = %v, want %v", i, got, st.write)
				}
				s.done(at(st.now), st.outcome)
				if got := s.next().Sub(t0); got != st.next {
					t.Errorf("step %d: next() = %v, want %v", i, got, st.next)
				}
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Options)
		want string // a substring of the error; empty: valid
	}{
		{"defaults", func(*Options) {}, ""},
		{"no interval", func(o *Options) { o.Interval = 0 }, "--publish-interval must be greater than 0"},
		{"sub-second interval", func(o *Options) { o.Interval, o.MinInterval = 500*time.Millisecond, 100*time.Millisecond }, "at least 1s"},
		{"no min interval", func(o *Options) { o.MinInterval = 0 }, "--publish-min-interval must be greater than 0"},
		{"min above interval", func(o *Options) { o.MinInterval = time.Minute }, "must not exceed --publish-interval"},
		{"no changes carried", func(o *Options) { o.MaxChanges = 0 }, ""},
		{"as many changes as a shard holds", func(o *Options) { o.MaxChanges = 4096 }, ""},
		{"negative max changes", func(o *Options) { o.MaxChanges = -1 }, "--publish-max-changes must be from 0 to 4096, got -1"},
		{"too many changes", func(o *Options) { o.MaxChanges = 4097 }, "--publish-max-changes must be from 0 to 4096, got 4097"},
		{"unknown shard format", func(o *Options) { o.ShardFormat = "csv" }, `--publish-shard-format must be packed or structured, got "csv"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			tt.mod(&o)
			err := o.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}
