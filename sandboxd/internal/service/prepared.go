package service

import (
	"context"
	"os"

	"github.com/skiff-dev/skiff/sandboxd/internal/prepared"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// Sandboxes prepared ahead of cold creates (package prepared): the pool
// keeps them, the service makes them through the runtime.

// preparable reports whether l may start from a prepared sandbox: a create
// (warm sandboxes are started ahead of time anyway) with the network every
// prepared sandbox has, internet access included, and its disk, of the
// default size.
func (s *Service) preparable(l *launch) bool {
	return s.prepared != nil && l.kind == kindCreate && l.rec.AllowInternetAccess && l.disk == s.cfg.DefaultDiskMiB && len(l.layers) == 0 && l.image == "" && l.rec.Egress == nil && len(l.rec.VolumeMounts) == 0
}

// preparer is the prepared pool's prepared.Maker: sandboxes made through
// the runtime's sandboxrt.Preparer, on the service's addresses and network.
type preparer struct {
	s  *Service
	rt sandboxrt.Preparer
}

// Prepare makes one prepared sandbox of tmpl, with the default limits.
func (p preparer) Prepare(ctx context.Context, tmpl *template.Template) (_ *prepared.Sandbox, err error) {
	s := p.s
	id, err := sandboxid.New(s.tag)
	if err != nil {
		return nil, err
	}
	block, err := s.ipam.Allocate(id)
	if err != nil {
		return nil, err
	}
	ps := &prepared.Sandbox{ID: id, Block: block}
	defer func() {
		if err != nil {
			p.Release(context.WithoutCancel(ctx), ps)
		}
	}()
	if ps.NetNS, err = s.net.Setup(ctx, id, block, true); err != nil {
		return nil, err
	}
	l := &launch{kind: kindCreate, tmpl: tmpl, cpu: s.cfg.DefaultCPUMilli, mem: s.cfg.DefaultMemoryMiB, disk: s.cfg.DefaultDiskMiB}
	if err := p.rt.Prepare(ctx, s.spec(id, l, block, ps.NetNS, s.logPath(id))); err != nil {
		return nil, err
	}
	return ps, nil
}

// Release removes what a prepared sandbox holds.
func (p preparer) Release(ctx context.Context, ps *prepared.Sandbox) {
	s := p.s
	if err := s.rt.Stop(ctx, ps.ID); err != nil {
		s.log.ErrorContext(ctx, "remove a prepared sandbox", "sandbox", ps.ID, "error", err)
	}
	_ = os.Remove(s.logPath(ps.ID))
	if ps.NetNS != "" {
		if err := s.net.Teardown(ctx, ps.ID, ps.Block); err != nil {
			s.log.ErrorContext(ctx, "tear down the network of a prepared sandbox", "sandbox", ps.ID, "error", err)
		}
	}
	s.ipam.Release(ps.ID)
}
