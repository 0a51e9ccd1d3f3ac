package service

import (
	"context"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/shared/egress"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// A sandbox's outbound rules (e2b's allowOut and denyOut, shared/egress)
// are kept in its record as given and enforced by the network (its own
// nftables chain, network.SetPolicy) and, for names and DNS, by the egress
// filters, which find it by its address (egressproxy.Sandboxes). A sandbox
// created without rules has none of that: its internet access is the one
// switch it always had.

// policyOf is rec's effective rules, and whether it has rules that can
// refuse something.
func policyOf(rec *store.Record) (egress.Rules, bool) {
	if rec.Egress == nil {
		return egress.Rules{}, false
	}
	internet := rec.AllowInternetAccess
	r := egress.Effective(rec.Egress.AllowOut, rec.Egress.DenyOut, &internet)
	return r, r.Restricts()
}

// setupNetwork makes rec's network namespace at block and applies its
// rules; on failure it leaves nothing of them.
func (s *Service) setupNetwork(ctx context.Context, id string, rec *store.Record, block ipam.Block) (string, error) {
	r, restricted := policyOf(rec)
	netns, err := s.net.Setup(ctx, id, block, rec.AllowInternetAccess && !restricted)
	if err != nil {
		return "", err
	}
	if restricted {
		if err := s.applyRules(id, rec, block); err != nil {
			if terr := s.net.Teardown(context.WithoutCancel(ctx), id, block); terr != nil {
				s.log.ErrorContext(ctx, "tear down the network of a sandbox whose rules failed", "sandbox", id, "error", terr)
			}
			return "", err
		}
	} else {
		s.trackEgress(block, rec.Team, r, false)
	}
	return netns, nil
}

// applyRules makes the network (set up) of sandbox id, recorded as rec,
// follow its rules now.
func (s *Service) applyRules(id string, rec *store.Record, block ipam.Block) error {
	r, restricted := policyOf(rec)
	if err := s.net.SetPolicy(id, block, rec.AllowInternetAccess, r); err != nil {
		return fmt.Errorf("apply the outbound rules of sandbox %s: %w", id, err)
	}
	s.trackEgress(block, rec.Team, r, restricted)
	return nil
}

// trackEgress tells the egress filters the team and rules of the running
// sandbox at block. One whose rules stop restricting anything stays known
// to them (what the proxy relays for it goes on) until forgetEgress.
func (s *Service) trackEgress(block ipam.Block, team string, r egress.Rules, restricted bool) {
	if s.egress == nil {
		return
	}
	if restricted {
		s.egress.Set(block.Sandbox, team, r)
	} else {
		s.egress.Update(block.Sandbox, r)
	}
}

// forgetEgress tells the egress filters that the sandbox at block ended,
// which ends what the proxy relays for it.
func (s *Service) forgetEgress(block ipam.Block) {
	if s.egress != nil {
		s.egress.Delete(block.Sandbox)
	}
}

// UpdateNetwork replaces a running sandbox's outbound rules (e2b's PUT
// /sandboxes/{id}/network).
func (s *Service) UpdateNetwork(ctx context.Context, req *connect.Request[pb.UpdateNetworkRequest]) (*connect.Response[pb.UpdateNetworkResponse], error) {
	m := req.Msg
	var f fieldErrors
	checkID(&f, m.GetSandboxId())
	checkTeam(&f, m.GetTeam())
	if err := egress.Validate(m.GetEgress().GetAllowOut(), m.GetEgress().GetDenyOut()); err != nil {
		f.add("egress", "%v", err)
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	defer s.locks.lock(m.GetSandboxId())()
	rec, err := s.reg.Get(m.GetSandboxId())
	if err != nil || (m.GetTeam() != "" && rec.Team != m.GetTeam()) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s not found", m.GetSandboxId()))
	}
	if rec.State != registry.StateRunning {
		// e2b's answer for a paused sandbox: it is not among the running.
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s is not running", m.GetSandboxId()))
	}
	block, err := s.blockOf(rec)
	if err != nil {
		return nil, err
	}
	old := *rec
	updated, err := s.reg.Update(rec.ID, func(r *store.Record) error {
		r.Egress = &store.Egress{AllowOut: slices.Clone(m.GetEgress().GetAllowOut()), DenyOut: slices.Clone(m.GetEgress().GetDenyOut())}
		if m.AllowInternetAccess != nil {
			r.AllowInternetAccess = m.GetAllowInternetAccess()
		}
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	if err := s.applyRules(rec.ID, updated, block); err != nil {
		// Back to what was enforced and recorded.
		if rerr := s.applyRules(rec.ID, &old, block); rerr != nil {
			s.log.ErrorContext(ctx, "restore a sandbox's outbound rules", "sandbox", rec.ID, "error", rerr)
		}
		if _, rerr := s.reg.Update(rec.ID, func(r *store.Record) error {
			r.Egress, r.AllowInternetAccess = old.Egress, old.AllowInternetAccess
			return nil
		}); rerr != nil {
			s.log.ErrorContext(ctx, "restore a sandbox's record of outbound rules", "sandbox", rec.ID, "error", rerr)
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	r, restricted := policyOf(updated)
	s.log.InfoContext(ctx, "sandbox network updated", "sandbox", rec.ID, "team", rec.Team, "restricted", restricted,
		"allow_cidrs", len(r.AllowCIDRs), "allow_domains", len(r.AllowDomains), "deny_cidrs", len(r.DenyCIDRs), "internet", updated.AllowInternetAccess)
	return connect.NewResponse(&pb.UpdateNetworkResponse{Sandbox: s.toSandbox(updated)}), nil
}

// checkEgress validates a create's rules.
func checkEgress(f *fieldErrors, e *pb.Egress, mask string) {
	if err := egress.Validate(e.GetAllowOut(), e.GetDenyOut()); err != nil {
		f.add("egress", "%v", err)
	}
	if len(mask) > 255 {
		f.add("mask_request_host", "at most 255 bytes")
	}
}
