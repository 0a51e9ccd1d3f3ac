// Package prepared keeps sandboxes made ahead of cold creates.
//
// A cold create spends most of its time before envd runs: the network
// namespace, the overlay root, the cgroup, the runtime's namespaces, mounts
// and seccomp filter. When the runtime can do that ahead of time
// (sandboxrt.Preparer), sandboxd keeps --prepared-sandboxes such sandboxes
// per template that creates asked for, each with its ID, address and
// network, its init stopped just before it would run envd. A create takes
// one, gives it its limits and lets it run envd; a prepared sandbox then
// replaces it in the background. Nothing of a workload runs in a prepared
// sandbox (not even envd), it uses no CPU, and it is not a sandbox of the
// API: no record, not listed, not counted against the host's capacity. A
// restarted sandboxd finds the ones its predecessor left without records
// and removes them, as it does any half-made sandbox.
//
// The Pool only keeps them: a Maker (the server) makes and removes them.
package prepared

import (
	"context"
	"log/slog"
	"sync"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// Sandbox is one sandbox prepared for a template.
type Sandbox struct {
	ID    string
	Block ipam.Block
	// NetNS is the path of its network namespace; "" until set up.
	NetNS string
}

// Maker makes and removes prepared sandboxes.
type Maker interface {
	// Prepare makes one prepared sandbox of tmpl. A failed Prepare leaves
	// nothing behind.
	Prepare(ctx context.Context, tmpl *template.Template) (*Sandbox, error)
	// Release removes what a prepared sandbox holds.
	Release(ctx context.Context, ps *Sandbox)
}

// Pool holds up to per prepared sandboxes for each template it was asked
// to fill, by the template's root filesystem (a template's version).
type Pool struct {
	maker Maker
	per   int
	log   *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	ready map[string][]*Sandbox // by template root
	// filling holds, per template root being filled, a channel closed when
	// the sandbox being prepared is ready (or failed).
	filling map[string]chan struct{}
	closed  bool
}

// New returns a pool of per sandboxes a template; its fills run until
// Close.
func New(m Maker, per int, log *slog.Logger) *Pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool{
		maker: m, per: per, log: log, ctx: ctx, cancel: cancel,
		ready: map[string][]*Sandbox{}, filling: map[string]chan struct{}{},
	}
}

// Take returns a sandbox prepared for tmpl, or nil. When none is ready but
// one is being prepared, it waits for that one (once): it is further along
// than a start from nothing, which would share the CPUs with it.
func (p *Pool) Take(ctx context.Context, tmpl *template.Template) *Sandbox {
	key := tmpl.Rootfs
	p.mu.Lock()
	defer p.mu.Unlock()
	for waited := false; ; waited = true {
		if q := p.ready[key]; len(q) > 0 {
			p.ready[key] = q[1:]
			return q[0]
		}
		ch, filling := p.filling[key]
		if !filling || waited {
			return nil
		}
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		p.mu.Lock()
	}
}

// Fill prepares sandboxes for tmpl in the background until per are ready,
// unless that is already under way.
func (p *Pool) Fill(tmpl *template.Template) {
	key := tmpl.Rootfs
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, filling := p.filling[key]; p.closed || filling || len(p.ready[key]) >= p.per {
		return
	}
	p.filling[key] = make(chan struct{})
	p.wg.Go(func() {
		for {
			ps, err := p.maker.Prepare(p.ctx, tmpl)
			p.mu.Lock()
			done := p.filling[key]
			if err == nil && !p.closed {
				p.ready[key] = append(p.ready[key], ps)
				ps = nil
			}
			more := err == nil && !p.closed && len(p.ready[key]) < p.per
			if more {
				p.filling[key] = make(chan struct{})
			} else {
				delete(p.filling, key)
			}
			close(done)
			p.mu.Unlock()
			if err != nil && p.ctx.Err() == nil {
				p.log.Warn("prepare a sandbox", "template", tmpl.Name, "error", err)
			}
			if ps != nil {
				p.maker.Release(context.Background(), ps)
			}
			if !more {
				return
			}
		}
	})
}

// Close stops filling, waits for the fills and removes every prepared
// sandbox.
func (p *Pool) Close(ctx context.Context) {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	all := p.ready
	p.ready = map[string][]*Sandbox{}
	p.mu.Unlock()
	for _, q := range all {
		for _, ps := range q {
			p.maker.Release(ctx, ps)
		}
	}
}
