package service

import "sync"

// keyedMutex serialises the operations on one sandbox (a kill racing a
// pause, a deadline firing during a resume) while different sandboxes
// proceed in parallel. Its zero value is ready.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

// lock locks id and returns its unlock.
func (k *keyedMutex) lock(id string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*refMutex{}
	}
	m, ok := k.locks[id]
	if !ok {
		m = &refMutex{}
		k.locks[id] = m
	}
	m.refs++
	k.mu.Unlock()
	m.Lock()
	return func() {
		m.Unlock()
		k.mu.Lock()
		m.refs--
		if m.refs == 0 {
			delete(k.locks, id)
		}
		k.mu.Unlock()
	}
}
