package service

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/tracing"
	"github.com/skiff-dev/skiff/wire"
)

// Claim hands a warm sandbox to a team: atomically through the registry (of
// concurrent claims of one sandbox exactly one wins), with a deadline and an
// access token nobody else holds. A warm sandbox's envd already holds such a
// token: sandboxd made it when it warmed the sandbox and never gave it out
// (Get and List do not show a warm sandbox's token). So a claim without
// environment variables hands that token over and needs no round trip into
// the sandbox; a claim with them posts them to envd's /init, together with a
// token made now. A sandbox whose envd refuses the /init is killed: nobody
// could use it.
func (s *Service) Claim(ctx context.Context, req *connect.Request[pb.ClaimRequest]) (_ *connect.Response[pb.ClaimResponse], err error) {
	m := req.Msg
	var f fieldErrors
	switch {
	case m.GetSandboxId() != "":
		checkID(&f, m.GetSandboxId())
	case m.GetPool() != "":
		checkPool(&f, m.GetPool())
	case m.GetTemplate() != "":
		if !templateRE.MatchString(m.GetTemplate()) {
			f.add("template", "%q is not a template name", truncate(m.GetTemplate()))
		}
	default:
		f.add("sandbox_id", "set sandbox_id, pool or template")
	}
	timeout := s.checkTimeout(&f, "timeout", m.GetTimeout(), true)
	checkMetadata(&f, m.GetMetadata())
	checkEnvVars(&f, m.GetEnvVars())
	checkTeam(&f, m.GetTeam())
	if err := f.err(); err != nil {
		return nil, s.countClaim(err, 0)
	}

	began := time.Now()
	defer func() { err = s.countClaim(err, time.Since(began)) }()
	traffic := trafficToken(m.AllowPublicTraffic)
	// rotate: the environment goes to envd through /init, and a new token
	// with it.
	rotate := len(m.GetEnvVars()) > 0
	var oldToken, token string
	now := s.clock.Now()
	hand := func(rec *store.Record) error {
		oldToken, token = rec.EnvdAccessToken, rec.EnvdAccessToken
		if rotate {
			token = sandboxid.NewAccessToken(rec.ID)
		}
		rec.Team = m.GetTeam()
		rec.Metadata = maps.Clone(m.GetMetadata())
		rec.AutoPause = m.GetAutoPause()
		rec.AutoResume = m.GetAutoResume()
		rec.AutoPauseFilesOnly = m.GetAutoPauseFilesOnly()
		rec.EnvVars = maps.Clone(m.GetEnvVars())
		rec.TrafficAccessToken = traffic
		rec.StartedAt, rec.RunStart = now, now
		rec.EndAt, rec.Timeout = now.Add(timeout), timeout
		rec.EnvdAccessToken = token
		return nil
	}

	var rec *store.Record
	if id := m.GetSandboxId(); id != "" {
		defer s.locks.lock(id)()
		if rec, err = s.reg.Claim(id, hand); err != nil {
			return nil, toConnect(fmt.Errorf("claim sandbox %s: %w", id, err))
		}
	} else {
		if rec, err = s.reg.ClaimAny(m.GetPool(), m.GetTemplate(), hand); err != nil {
			return nil, toConnect(fmt.Errorf("claim a warm sandbox: %w", err))
		}
		defer s.locks.lock(rec.ID)()
		// A kill may have come between the claim and the lock.
		if cur, err := s.reg.Get(rec.ID); err != nil || cur.EnvdAccessToken != token || !cur.StartedAt.Equal(now) {
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("claimed sandbox %s went away", rec.ID))
		}
	}

	trace.SpanFromContext(ctx).SetAttributes(tracing.SandboxIDKey.String(rec.ID), tracing.TemplateKey.String(rec.Template))
	tookRecord, step := time.Since(began), time.Now()
	if rotate {
		if err := s.rotateToken(ctx, rec, oldToken, token, m.GetEnvVars()); err != nil {
			s.log.WarnContext(ctx, "claimed sandbox's envd refused the new token; killing it", "sandbox", rec.ID, "error", err)
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if kerr := s.killLocked(kctx, rec, reasonClaimFailed); kerr != nil {
				s.log.ErrorContext(ctx, "kill sandbox after failed claim; its deadline tries again", "sandbox", rec.ID, "error", kerr)
				s.endAtNow(kctx, rec.ID)
			}
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("hand sandbox %s over: %w", rec.ID, err))
		}
	}
	s.deadlines.Set(rec.ID, rec.EndAt)
	s.log.InfoContext(ctx, "sandbox claimed", "sandbox", rec.ID, "team", rec.Team, "pool", rec.Pool, "template", rec.Template,
		"duration", time.Since(began), "record", tookRecord, "envd", time.Since(step), "env_vars", rotate)
	return connect.NewResponse(&pb.ClaimResponse{Sandbox: s.toSandbox(rec), EnvdAccessToken: token, TrafficAccessToken: traffic}), nil
}

// endAtNow gives sandbox id, whose kill failed, a deadline of now that
// kills it (not auto-pause), so that the deadline's retries end it: the
// claim already made it a team's, with no deadline armed.
func (s *Service) endAtNow(ctx context.Context, id string) {
	at := s.clock.Now()
	if _, err := s.reg.Update(id, func(r *store.Record) error {
		r.EndAt, r.AutoPause = at, false
		return nil
	}); err != nil {
		s.log.ErrorContext(ctx, "record the deadline of a sandbox whose kill failed", "sandbox", id, "error", err)
		// Then it ends at the claim's deadline, which its record keeps.
		if rec, err := s.reg.Get(id); err == nil {
			at = rec.EndAt
		}
	}
	s.deadlines.Set(id, at)
}

// rotateToken gives the sandbox's envd its new owner's token and
// environment, authenticated by the token it holds now; the span
// "envd.init".
func (s *Service) rotateToken(ctx context.Context, rec *store.Record, oldToken, token string, env map[string]string) (err error) {
	ctx, span := tracer.Start(ctx, "envd.init", trace.WithAttributes(tracing.SandboxIDKey.String(rec.ID)))
	defer tracing.End(span, &err)
	b, err := s.blockOf(rec)
	if err != nil {
		return err
	}
	in := &wire.EnvdInit{AccessToken: &token, EnvVars: sandboxEnv(rec.ID, rec.Template, env), Timestamp: s.clock.Now().UTC().Format(time.RFC3339Nano)}
	_, err = s.envd.Init(ctx, s.envdAddr(b), oldToken, in)
	return err
}

// blockOf is the address block the sandbox holds.
func (s *Service) blockOf(rec *store.Record) (ipam.Block, error) {
	addr, err := netip.ParseAddr(rec.Address)
	if err != nil {
		return ipam.Block{}, fmt.Errorf("sandbox %s: address %q: %w", rec.ID, rec.Address, err)
	}
	return s.ipam.Claim(rec.ID, addr)
}
