// Package fairslots hands out a bounded number of slots, at most a share
// of them to any one holder: the servers and dials sandboxd runs for every
// sandbox of its host are bounded so that they cannot exhaust sandboxd,
// and shared so that one sandbox (its tenant's code, which decides how
// long it holds a slot) cannot take them all from the others.
package fairslots

import "sync"

// Slots are total slots, at most perKey of them held by one key at once.
type Slots[K comparable] struct {
	mu            sync.Mutex
	total, perKey int
	used          int
	held          map[K]int
}

// New returns total slots (at least 1), at most perKey (at least 1) to one
// key.
func New[K comparable](total, perKey int) *Slots[K] {
	return &Slots[K]{total: max(total, 1), perKey: max(perKey, 1), held: map[K]int{}}
}

// Refusal says why Take refused a slot.
type Refusal int

const (
	// Taken is no refusal: the slot is k's; give it back with Put.
	Taken Refusal = iota
	// KeyFull is a refusal because k holds its share.
	KeyFull
	// AllFull is a refusal because every slot is held.
	AllFull
)

// Take takes a slot for k, or says why it cannot.
func (s *Slots[K]) Take(k K) Refusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.held[k] >= s.perKey:
		return KeyFull
	case s.used >= s.total:
		return AllFull
	}
	s.held[k]++
	s.used++
	return Taken
}

// Put gives back a slot Take gave k.
func (s *Slots[K]) Put(k K) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[k] <= 1 {
		delete(s.held, k)
	} else {
		s.held[k]--
	}
	s.used--
}
