package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/publish"
)

// Writes counts the writes (server-side applies and stamps) of the hosts that share it, and
// how long each took: what the publishers ask of kube-apiserver. It is
// safe for concurrent use.
type Writes struct {
	mu     sync.Mutex
	ok     int
	failed int
	took   []time.Duration
}

// WriteStats are the applies since the last Take.
type WriteStats struct {
	// OK and Failed count the applies that succeeded and failed.
	OK, Failed int
	// Took is how long each successful apply took, in the order they ended.
	Took []time.Duration
}

// Take returns the applies counted since the last Take and starts over.
func (w *Writes) Take() WriteStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := WriteStats{OK: w.ok, Failed: w.failed, Took: w.took}
	w.ok, w.failed, w.took = 0, 0, nil
	return st
}

func (w *Writes) record(took time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.failed++
		return
	}
	w.ok++
	w.took = append(w.took, took)
}

// countingWriter is a host's publish.Writer, counted in a Writes.
type countingWriter struct {
	publish.Writer
	w *Writes
}

// Stamp is the writer's own (publish.Stamper), counted as a write.
func (c countingWriter) Stamp(ctx context.Context, inv *v1beta1.NodeInventory) error {
	st, ok := c.Writer.(publish.Stamper)
	if !ok {
		return fmt.Errorf("%T: %w", c.Writer, publish.ErrStale)
	}
	start := time.Now()
	err := st.Stamp(ctx, inv)
	if ctx.Err() == nil && (err == nil || !errors.Is(err, publish.ErrStale)) {
		c.w.record(time.Since(start), err)
	}
	return err
}

func (c countingWriter) Apply(ctx context.Context, inv *v1beta1.NodeInventory) error {
	start := time.Now()
	err := c.Writer.Apply(ctx, inv)
	if ctx.Err() == nil {
		c.w.record(time.Since(start), err)
	}
	return err
}
