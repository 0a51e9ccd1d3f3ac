package server

import (
	"context"
	"os"
	"sync"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

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
type preparedPool struct {
	s   *Server
	rt  sandboxrt.Preparer
	per int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	ready map[string][]*preparedSandbox // by template root
	// filling holds, per template root being filled, a channel closed when
	// the sandbox being prepared is ready (or failed).
	filling map[string]chan struct{}
	closed  bool
}

// preparedSandbox is one sandbox prepared for a template.
type preparedSandbox struct {
	id    string
	block ipam.Block
	netns string
}

// newPreparedPool returns the pool, or nil when the runtime cannot prepare
// sandboxes or per is 0.
func newPreparedPool(s *Server, per int) *preparedPool {
	rt, ok := s.rt.(sandboxrt.Preparer)
	if !ok || per <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &preparedPool{
		s: s, rt: rt, per: per, ctx: ctx, cancel: cancel,
		ready: map[string][]*preparedSandbox{}, filling: map[string]chan struct{}{},
	}
}

// usable reports whether l may start from a prepared sandbox: a create
// (warm sandboxes are started ahead of time anyway) with the network every
// prepared sandbox has, internet access included, and its disk, of the
// default size.
func (p *preparedPool) usable(l *launch) bool {
	return p != nil && l.kind == kindCreate && l.rec.AllowInternetAccess && l.disk == p.s.opts.DefaultDiskMiB
}

// take returns a sandbox prepared for l's template, or nil. When none is
// ready but one is being prepared, it waits for that one (once): it is
// further along than a start from nothing, which would share the CPUs with
// it.
func (p *preparedPool) take(ctx context.Context, l *launch) *preparedSandbox {
	if !p.usable(l) {
		return nil
	}
	key := l.tmpl.Rootfs
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

// fill prepares sandboxes for tmpl in the background until --prepared-
// sandboxes are ready, unless that is already under way.
func (p *preparedPool) fill(l *launch) {
	if !p.usable(l) {
		return
	}
	tmpl, key := l.tmpl, l.tmpl.Rootfs
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, filling := p.filling[key]; p.closed || filling || len(p.ready[key]) >= p.per {
		return
	}
	p.filling[key] = make(chan struct{})
	p.wg.Go(func() {
		for {
			ps, err := p.s.prepare(p.ctx, p.rt, tmpl)
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
				p.s.log.Warn("prepare a sandbox", "template", tmpl.Name, "error", err)
			}
			if ps != nil {
				p.s.releasePrepared(context.Background(), ps)
			}
			if !more {
				return
			}
		}
	})
}

// close stops filling and removes every prepared sandbox.
func (p *preparedPool) close(ctx context.Context) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	all := p.ready
	p.ready = map[string][]*preparedSandbox{}
	p.mu.Unlock()
	for _, q := range all {
		for _, ps := range q {
			p.s.releasePrepared(ctx, ps)
		}
	}
}

// prepare makes one prepared sandbox of tmpl, with the default limits.
func (s *Server) prepare(ctx context.Context, rt sandboxrt.Preparer, tmpl *template.Template) (_ *preparedSandbox, err error) {
	id, err := sandboxid.New(s.tag)
	if err != nil {
		return nil, err
	}
	block, err := s.ipam.Allocate(id)
	if err != nil {
		return nil, err
	}
	ps := &preparedSandbox{id: id, block: block}
	defer func() {
		if err != nil {
			s.releasePrepared(context.WithoutCancel(ctx), ps)
		}
	}()
	if ps.netns, err = s.net.Setup(ctx, id, block, true); err != nil {
		return nil, err
	}
	l := &launch{kind: kindCreate, tmpl: tmpl, cpu: s.opts.DefaultCPUMilli, mem: s.opts.DefaultMemoryMiB, disk: s.opts.DefaultDiskMiB}
	if err := rt.Prepare(ctx, s.spec(id, l, block, ps.netns, s.logPath(id))); err != nil {
		return nil, err
	}
	return ps, nil
}

// releasePrepared removes what a prepared sandbox holds.
func (s *Server) releasePrepared(ctx context.Context, ps *preparedSandbox) {
	if err := s.rt.Stop(ctx, ps.id); err != nil {
		s.log.ErrorContext(ctx, "remove a prepared sandbox", "sandbox", ps.id, "error", err)
	}
	_ = os.Remove(s.logPath(ps.id))
	if ps.netns != "" {
		if err := s.net.Teardown(ctx, ps.id, ps.block); err != nil {
			s.log.ErrorContext(ctx, "tear down the network of a prepared sandbox", "sandbox", ps.id, "error", err)
		}
	}
	s.ipam.Release(ps.id)
}
