// Package hostwatch shares one mirror of sandboxd (shared/hostinventory's
// Host) among vk-sandbox's parts: the Host signals a change on one channel,
// which only one reader can drain, so a Fanout re-signals every change to
// each subscriber.
package hostwatch

import (
	"context"
	"sync"
)

// Fanout re-signals every receive of its source to each subscriber. Like
// the source, each subscriber's channel coalesces changes between two
// receives into one.
type Fanout struct {
	src  <-chan struct{}
	mu   sync.Mutex
	subs []chan struct{}
}

// NewFanout returns a fanout of src; Run drives it.
func NewFanout(src <-chan struct{}) *Fanout {
	return &Fanout{src: src}
}

// Subscribe returns a channel that receives after every change from now
// on, and once at once so that a new subscriber reads the current state.
func (f *Fanout) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	ch <- struct{}{}
	f.mu.Lock()
	f.subs = append(f.subs, ch)
	f.mu.Unlock()
	return ch
}

// Run forwards changes until ctx ends.
func (f *Fanout) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.src:
			f.mu.Lock()
			for _, ch := range f.subs {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
			f.mu.Unlock()
		}
	}
}
