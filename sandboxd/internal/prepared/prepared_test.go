package prepared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// maker prepares sandboxes named after their template; while gate is set,
// a Prepare waits for it to close.
type maker struct {
	mu       sync.Mutex
	n        int
	made     []string
	released []string
	gate     chan struct{}
	fail     error
}

func (m *maker) Prepare(ctx context.Context, tmpl *template.Template) (*Sandbox, error) {
	m.mu.Lock()
	gate, fail := m.gate, m.fail
	m.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	id := fmt.Sprintf("%s-%d", tmpl.Name, m.n)
	m.made = append(m.made, id)
	return &Sandbox{ID: id, NetNS: "/run/netns/" + id}, nil
}

func (m *maker) Release(_ context.Context, ps *Sandbox) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = append(m.released, ps.ID)
}

func (m *maker) counts() (made, released int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.made), len(m.released)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestFillTakeClose(t *testing.T) {
	m := &maker{}
	p := New(m, 2, quiet())
	base := &template.Template{Name: "base", Rootfs: "/t/base/v1"}
	other := &template.Template{Name: "other", Rootfs: "/t/other/v1"}
	if ps := p.Take(t.Context(), base); ps != nil {
		t.Fatalf("Take before any Fill = %+v", ps)
	}
	p.Fill(base)
	eventually(t, "two prepared", func() bool { made, _ := m.counts(); return made == 2 })
	p.Fill(base) // full: nothing more
	a := p.Take(t.Context(), base)
	if a == nil || a.ID != "base-1" {
		t.Fatalf("Take = %+v, want the first prepared", a)
	}
	if ps := p.Take(t.Context(), other); ps != nil {
		t.Fatalf("Take of another template = %+v", ps)
	}
	p.Fill(base) // one taken: one more
	eventually(t, "the one taken replaced", func() bool { made, _ := m.counts(); return made == 3 })
	p.Close(t.Context())
	m.mu.Lock()
	defer m.mu.Unlock()
	slices.Sort(m.released)
	if !slices.Equal(m.released, []string{"base-2", "base-3"}) {
		t.Fatalf("Close released %v, want the two still ready", m.released)
	}
}

// TestTakeWaitsForOneUnderWay: with none ready but one being prepared,
// Take waits for it rather than start from nothing.
func TestTakeWaitsForOneUnderWay(t *testing.T) {
	gate := make(chan struct{})
	m := &maker{gate: gate}
	p := New(m, 1, quiet())
	defer p.Close(context.Background())
	base := &template.Template{Name: "base", Rootfs: "/t/base/v1"}
	p.Fill(base)
	got := make(chan *Sandbox)
	go func() { got <- p.Take(t.Context(), base) }()
	select {
	case ps := <-got:
		t.Fatalf("Take = %+v before the one under way was ready", ps)
	case <-time.After(20 * time.Millisecond):
	}
	close(gate)
	if ps := <-got; ps == nil || ps.ID != "base-1" {
		t.Fatalf("Take = %+v, want the one that was under way", ps)
	}
}

// TestFailedPrepareStopsFilling: a failing Maker is not called in a loop,
// and Take does not wait for a fill that failed.
func TestFailedPrepareStopsFilling(t *testing.T) {
	m := &maker{fail: errors.New("no veth")}
	p := New(m, 3, quiet())
	base := &template.Template{Name: "base", Rootfs: "/t/base/v1"}
	p.Fill(base)
	if ps := p.Take(t.Context(), base); ps != nil {
		t.Fatalf("Take after a failed fill = %+v", ps)
	}
	p.Close(t.Context())
	if made, released := m.counts(); made != 0 || released != 0 {
		t.Fatalf("made %d, released %d", made, released)
	}
}

// TestCloseDuringFill: Close ends a fill under way, and a Fill after Close
// does nothing.
func TestCloseDuringFill(t *testing.T) {
	m := &maker{gate: make(chan struct{})}
	p := New(m, 1, quiet())
	base := &template.Template{Name: "base", Rootfs: "/t/base/v1"}
	p.Fill(base)
	p.Close(t.Context())
	p.Fill(base)
	if made, _ := m.counts(); made != 0 {
		t.Fatalf("%d made after Close", made)
	}
}
