package registry

import "github.com/skiff-dev/skiff/sandboxd/internal/store"

// EventType says what happened to a sandbox.
type EventType int

const (
	// Upserted means the sandbox was added or changed.
	Upserted EventType = iota + 1
	// Deleted means the sandbox is gone.
	Deleted
)

// Event is one change, with the record as it is after it (as it was, for
// Deleted).
type Event struct {
	Type   EventType
	Record *store.Record
	// Ended says why a Deleted sandbox ended, when it ended by itself
	// (RemoveEnded); empty for a kill.
	Ended string
}

// WatchBuffer is how many changes a watcher may lag behind. One that falls
// further behind is dropped (its channel closes) and must watch again,
// starting from a fresh snapshot, as an informer relists.
const WatchBuffer = 1024

type watcher struct {
	events chan Event
}

// Watch returns every sandbox now, and a channel of every change after that
// snapshot, in order: nothing between the two is missed. The channel closes
// when stop is called or when the watcher lags WatchBuffer changes behind.
func (r *Registry) Watch() (snapshot []*store.Record, events <-chan Event, stop func()) {
	w := &watcher{events: make(chan Event, WatchBuffer)}
	r.mu.Lock()
	snapshot = make([]*store.Record, 0, len(r.sandboxes))
	for _, rec := range r.sandboxes {
		snapshot = append(snapshot, clone(rec))
	}
	r.watchers[w] = struct{}{}
	r.mu.Unlock()
	return snapshot, w.events, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.dropLocked(w)
	}
}

// notifyLocked delivers ev to every watcher without blocking, dropping the
// ones that are full.
func (r *Registry) notifyLocked(ev Event) {
	for w := range r.watchers {
		select {
		case w.events <- ev:
		default:
			r.dropLocked(w)
		}
	}
}

func (r *Registry) dropLocked(w *watcher) {
	if _, ok := r.watchers[w]; ok {
		delete(r.watchers, w)
		close(w.events)
	}
}
