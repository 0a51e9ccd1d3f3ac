// Package registry is sandboxd's in-memory view of its sandboxes, backed by
// the crash-safe store: every change is written to the store before it is
// visible, capacity is reserved before a sandbox starts, a warm sandbox is
// claimed atomically (of concurrent claims exactly one wins), and watchers
// get a snapshot and then every change (the Watch RPC, which vk-sandbox
// publishes from).
package registry

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/skiff-dev/skiff/sandboxd/internal/store"
)

// Sandbox states, as the records and the API name them.
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateWarm    = "warm"
)

var (
	// ErrExhausted is returned when the host cannot take another sandbox.
	ErrExhausted = errors.New("host is full")
	// ErrNotFound is returned for a sandbox the host does not have.
	ErrNotFound = errors.New("sandbox not found")
	// ErrExists is returned when a sandbox ID is already taken.
	ErrExists = errors.New("sandbox already exists")
	// ErrNotWarm is returned when a claimed sandbox is no longer warm:
	// another claim won, or it was killed.
	ErrNotWarm = errors.New("sandbox is not warm")
)

// Limits is what the host may hand out: CPU and memory are the host's
// capacity times their overcommit ratios. With CPUShared, CPU is not
// admitted (a sandbox's vCPUs are its limit, not a reservation) and
// CPUMilli is the host's CPU, reported but never checked.
type Limits struct {
	MaxSandboxes int
	CPUMilli     int64
	CPUShared    bool
	MemoryMiB    int64
}

// Usage is what the host's sandboxes hold.
type Usage struct {
	Sandboxes int
	CPUMilli  int64
	MemoryMiB int64
}

// Registry holds the host's sandboxes. It is safe for concurrent use.
type Registry struct {
	store  *store.Store
	limits Limits

	mu        sync.Mutex
	sandboxes map[string]*store.Record
	reserved  Usage // admitted, not yet added
	watchers  map[*watcher]struct{}
}

// Open loads every record from st. Records that could not be read are
// reported in the error; the others load.
func Open(st *store.Store, limits Limits) (*Registry, error) {
	// Only a paused sandbox could outlive the host's uptime (a checkpoint
	// on disk); the others die with the host, records or not. So only
	// their records pay for an fsync (see package store).
	st.SetSync(func(rec *store.Record) bool { return rec.State == StatePaused })
	recs, err := st.Load()
	r := &Registry{store: st, limits: limits, sandboxes: make(map[string]*store.Record, len(recs)), watchers: map[*watcher]struct{}{}}
	for _, rec := range recs {
		r.sandboxes[rec.ID] = rec
	}
	return r, err
}

// Reservation is capacity held for a sandbox that is starting.
type Reservation struct {
	r    *Registry
	u    Usage
	once sync.Once
}

// Release gives the capacity back; it does nothing after the first call,
// nor after Add took the reservation over.
func (v *Reservation) Release() {
	v.once.Do(func() {
		v.r.mu.Lock()
		defer v.r.mu.Unlock()
		v.r.reserved = sub(v.r.reserved, v.u)
	})
}

// Reserve holds capacity for one sandbox of cpuMilli and memoryMiB, or
// fails with ErrExhausted naming what ran out.
func (r *Registry) Reserve(cpuMilli, memoryMiB int64) (*Reservation, error) {
	u := Usage{Sandboxes: 1, CPUMilli: cpuMilli, MemoryMiB: memoryMiB}
	r.mu.Lock()
	defer r.mu.Unlock()
	after := add(add(r.usageLocked(), r.reserved), u)
	var short []string
	if after.Sandboxes > r.limits.MaxSandboxes {
		short = append(short, fmt.Sprintf("sandboxes (%d of %d)", after.Sandboxes, r.limits.MaxSandboxes))
	}
	if !r.limits.CPUShared && after.CPUMilli > r.limits.CPUMilli {
		short = append(short, fmt.Sprintf("cpu (%dm of %dm)", after.CPUMilli, r.limits.CPUMilli))
	}
	if after.MemoryMiB > r.limits.MemoryMiB {
		short = append(short, fmt.Sprintf("memory (%dMi of %dMi)", after.MemoryMiB, r.limits.MemoryMiB))
	}
	if len(short) > 0 {
		return nil, fmt.Errorf("%w: no room for %s", ErrExhausted, strings.Join(short, ", "))
	}
	r.reserved = add(r.reserved, u)
	return &Reservation{r: r, u: u}, nil
}

// Add records a started sandbox, durably, and takes over its reservation.
func (r *Registry) Add(v *Reservation, rec *store.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.sandboxes[rec.ID]; ok {
		return fmt.Errorf("%w: %s", ErrExists, rec.ID)
	}
	if err := r.store.Put(rec); err != nil {
		return err
	}
	r.sandboxes[rec.ID] = clone(rec)
	v.once.Do(func() { r.reserved = sub(r.reserved, v.u) })
	r.notifyLocked(Event{Type: Upserted, Record: clone(rec)})
	return nil
}

// Get returns a copy of a sandbox's record.
func (r *Registry) Get(id string) (*store.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return clone(rec), nil
}

// List returns copies of every record, sorted by ID.
func (r *Registry) List() []*store.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*store.Record, 0, len(r.sandboxes))
	for _, id := range slices.Sorted(maps.Keys(r.sandboxes)) {
		out = append(out, clone(r.sandboxes[id]))
	}
	return out
}

// Update changes a record through fn, durably. fn works on a copy: if it
// fails or the store does, nothing changes.
func (r *Registry) Update(id string, fn func(*store.Record) error) (*store.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updateLocked(id, fn)
}

func (r *Registry) updateLocked(id string, fn func(*store.Record) error) (*store.Record, error) {
	cur, ok := r.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	next := clone(cur)
	if err := fn(next); err != nil {
		return nil, err
	}
	next.ID = id
	if err := r.store.Put(next); err != nil {
		return nil, err
	}
	r.sandboxes[id] = next
	r.notifyLocked(Event{Type: Upserted, Record: clone(next)})
	return clone(next), nil
}

// Claim hands the warm sandbox id to its new owner through fn (team,
// metadata, deadline, token), making it running. Of concurrent claims of one
// sandbox exactly one succeeds; the others get ErrNotWarm.
func (r *Registry) Claim(id string, fn func(*store.Record) error) (*store.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updateLocked(id, func(rec *store.Record) error {
		if rec.State != StateWarm {
			return fmt.Errorf("%w: %s is %s", ErrNotWarm, id, rec.State)
		}
		if err := fn(rec); err != nil {
			return err
		}
		rec.State = StateRunning
		return nil
	})
}

// ClaimAny claims one warm sandbox of pool (or, with pool empty, of
// template), as Claim does.
func (r *Registry) ClaimAny(pool, template string, fn func(*store.Record) error) (*store.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(r.sandboxes)) {
		rec := r.sandboxes[id]
		if rec.State != StateWarm || (pool != "" && rec.Pool != pool) || (pool == "" && rec.Template != template) {
			continue
		}
		return r.updateLocked(id, func(rec *store.Record) error {
			if err := fn(rec); err != nil {
				return err
			}
			rec.State = StateRunning
			return nil
		})
	}
	return nil, fmt.Errorf("%w: no warm sandbox of pool %q template %q", ErrNotFound, pool, template)
}

// Remove forgets a sandbox, durably; removing an unknown one is not an error.
func (r *Registry) Remove(id string) error { return r.RemoveEnded(id, "") }

// RemoveEnded is Remove of a sandbox that ended by itself, with why, which
// its Deleted event carries.
func (r *Registry) RemoveEnded(id, why string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.store.Delete(id); err != nil {
		return err
	}
	if rec, ok := r.sandboxes[id]; ok {
		delete(r.sandboxes, id)
		r.notifyLocked(Event{Type: Deleted, Record: clone(rec), Ended: why})
	}
	return nil
}

// Usage returns what the host's sandboxes and reservations hold.
func (r *Registry) Usage() Usage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return add(r.usageLocked(), r.reserved)
}

func (r *Registry) usageLocked() Usage {
	var u Usage
	for _, rec := range r.sandboxes {
		u = add(u, Usage{Sandboxes: 1, CPUMilli: rec.CPUMilli, MemoryMiB: rec.MemoryMiB})
	}
	return u
}

func add(a, b Usage) Usage {
	return Usage{a.Sandboxes + b.Sandboxes, a.CPUMilli + b.CPUMilli, a.MemoryMiB + b.MemoryMiB}
}

func sub(a, b Usage) Usage {
	return Usage{a.Sandboxes - b.Sandboxes, a.CPUMilli - b.CPUMilli, a.MemoryMiB - b.MemoryMiB}
}

func clone(rec *store.Record) *store.Record {
	c := *rec
	c.Metadata = maps.Clone(rec.Metadata)
	c.RuntimeState = slices.Clone(rec.RuntimeState)
	return &c
}
