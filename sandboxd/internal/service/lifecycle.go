package service

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// expireRetry is how soon a deadline whose kill or pause failed fires again.
const expireRetry = time.Minute

// Get returns one sandbox.
func (s *Service) Get(_ context.Context, req *connect.Request[pb.GetRequest]) (*connect.Response[pb.GetResponse], error) {
	if err := validID(req.Msg.GetSandboxId()); err != nil {
		return nil, err
	}
	rec, err := s.reg.Get(req.Msg.GetSandboxId())
	if err != nil {
		return nil, toConnect(err)
	}
	resp := &pb.GetResponse{Sandbox: s.toSandbox(rec), EnvdAccessToken: rec.EnvdAccessToken, TrafficAccessToken: rec.TrafficAccessToken}
	if rec.State == registry.StateWarm {
		// A warm sandbox's token is its future owner's: only Claim gives it.
		resp.EnvdAccessToken = ""
	}
	return connect.NewResponse(resp), nil
}

// List returns the host's sandboxes, of one team and some states when the
// request says so, sorted by ID.
func (s *Service) List(_ context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	m := req.Msg
	out := []*pb.Sandbox{}
	for _, rec := range s.reg.List() {
		if m.GetTeam() != "" && rec.Team != m.GetTeam() {
			continue
		}
		if len(m.GetStates()) > 0 && !slices.Contains(m.GetStates(), toState(rec.State)) {
			continue
		}
		out = append(out, s.toSandbox(rec))
	}
	return connect.NewResponse(&pb.ListResponse{Sandboxes: out}), nil
}

// Kill stops a sandbox and forgets it.
func (s *Service) Kill(ctx context.Context, req *connect.Request[pb.KillRequest]) (*connect.Response[pb.KillResponse], error) {
	id := req.Msg.GetSandboxId()
	if err := validID(id); err != nil {
		return nil, err
	}
	defer s.locks.lock(id)()
	rec, err := s.reg.Get(id)
	if err != nil {
		return nil, toConnect(err)
	}
	if err := s.killLocked(ctx, rec, reasonAPI); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.KillResponse{}), nil
}

// Kill reasons, a metric label.
const (
	reasonAPI         = "api"
	reasonDeadline    = "deadline"
	reasonClaimFailed = "claim_failed"
)

// killLocked stops the sandbox, releases its network and address, and
// removes its record and log. If the runtime cannot stop it, the record
// stays, so a retry (or a restart's recovery) finds it again.
func (s *Service) killLocked(ctx context.Context, rec *store.Record, reason string) error {
	return s.endLocked(ctx, rec, reason, "")
}

// endLocked is killLocked of a sandbox that ended for why (a Watch delete
// says it; empty for a kill).
func (s *Service) endLocked(ctx context.Context, rec *store.Record, reason, why string) (err error) {
	defer func() { s.metrics.kills.WithLabelValues(reason, resultOf(toConnect(err))).Inc() }()
	if err := s.rt.Stop(ctx, rec.ID); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", rec.ID, err)
	}
	s.releaseNetwork(ctx, rec)
	if err := s.reg.RemoveEnded(rec.ID, why); err != nil {
		return fmt.Errorf("remove record of %s: %w", rec.ID, err)
	}
	s.releaseVolumes(ctx, rec.ID, rec.VolumeMounts)
	s.deadlines.Cancel(rec.ID)
	s.samples.Forget(rec.ID)
	if err := os.Remove(s.logPath(rec.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.WarnContext(ctx, "remove sandbox log", "sandbox", rec.ID, "error", err)
	}
	s.log.InfoContext(ctx, "sandbox killed", "sandbox", rec.ID, "reason", reason, "team", rec.Team)
	if len(rec.Layers) > 0 {
		s.gcLayers(ctx) // the last user of a deleted snapshot's layers
	}
	return nil
}

// releaseNetwork tears down the sandbox's network and frees its address.
// An address whose network could not be torn down stays taken (a new
// sandbox must not collide with leftovers); the next start's orphan sweep
// tears it down.
func (s *Service) releaseNetwork(ctx context.Context, rec *store.Record) {
	b, err := s.blockOf(rec)
	if err != nil {
		s.log.ErrorContext(ctx, "find sandbox address", "sandbox", rec.ID, "error", err)
	}
	s.forgetEgress(b)
	if err := s.net.Teardown(ctx, rec.ID, b); err != nil {
		s.log.ErrorContext(ctx, "tear down sandbox network; its address stays taken until restart", "sandbox", rec.ID, "error", err)
		return
	}
	s.ipam.Release(rec.ID)
}

// SetTimeout sets a running sandbox's deadline to now + timeout, no later
// than its last start + max_lifetime when that is set, and with
// only_extend never earlier than it was.
func (s *Service) SetTimeout(_ context.Context, req *connect.Request[pb.SetTimeoutRequest]) (*connect.Response[pb.SetTimeoutResponse], error) {
	m := req.Msg
	var f fieldErrors
	checkID(&f, m.GetSandboxId())
	timeout := s.checkTimeout(&f, "timeout", m.GetTimeout(), true)
	var maxLife time.Duration
	if d := m.GetMaxLifetime(); d != nil {
		// The caller's bound, not this host's (--max-timeout bounds a
		// single timeout): only its form is checked.
		if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 {
			f.add("max_lifetime", "must be a positive duration, got %v", d.AsDuration())
		}
		maxLife = d.AsDuration()
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	defer s.locks.lock(m.GetSandboxId())()
	rec, err := s.reg.Update(m.GetSandboxId(), func(r *store.Record) error {
		if r.State != registry.StateRunning {
			return fmt.Errorf("%w: sandbox %s is %s; only a running sandbox has a deadline", errWrongState, r.ID, r.State)
		}
		now := s.clock.Now()
		end := now.Add(timeout)
		if maxLife > 0 && !r.RunStart.IsZero() {
			// As e2b's API (KeepAliveFor): its life counts from its last
			// start, and past its longest it is refused.
			limit := r.RunStart.Add(maxLife)
			if !now.Before(limit) {
				return connect.NewError(connect.CodeOutOfRange, fmt.Errorf("sandbox %s has run for its longest lifetime of %s", r.ID, maxLife))
			}
			if end.After(limit) {
				end = limit
			}
		}
		if m.GetOnlyExtend() && !end.After(r.EndAt) {
			return nil
		}
		r.EndAt, r.Timeout = end, timeout
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	s.deadlines.Set(rec.ID, rec.EndAt)
	return connect.NewResponse(&pb.SetTimeoutResponse{Sandbox: s.toSandbox(rec)}), nil
}

// Pause freezes a running sandbox; it has no deadline while paused.
func (s *Service) Pause(ctx context.Context, req *connect.Request[pb.PauseRequest]) (*connect.Response[pb.PauseResponse], error) {
	id := req.Msg.GetSandboxId()
	if err := validID(id); err != nil {
		return nil, err
	}
	defer s.locks.lock(id)()
	rec, err := s.reg.Get(id)
	if err != nil {
		return nil, toConnect(err)
	}
	if rec.State != registry.StateRunning {
		return nil, toConnect(fmt.Errorf("%w: sandbox %s is %s, not running", errWrongState, id, rec.State))
	}
	// A pause that writes the sandbox to disk (its files, or gVisor's
	// checkpoint of its memory) keeps the disk's reserve; a freeze writes
	// nothing. (A pause at the deadline is not refused: the sandbox would
	// run on.)
	if _, checkpoints := s.rt.(sandboxrt.StateCapturer); req.Msg.GetFilesOnly() || checkpoints {
		if err := s.checkDisk("pause", s.stateDir); err != nil {
			return nil, toConnect(err)
		}
	}
	if rec, err = s.pauseLocked(ctx, rec, req.Msg.GetFilesOnly()); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.PauseResponse{Sandbox: s.toSandbox(rec)}), nil
}

// pauseLocked pauses a running sandbox, keeping its files only when
// filesOnly, and records when, which a resume without a timeout needs.
func (s *Service) pauseLocked(ctx context.Context, rec *store.Record, filesOnly bool) (*store.Record, error) {
	if filesOnly {
		return s.pauseFilesLocked(ctx, rec)
	}
	if err := s.rt.Pause(ctx, rec.ID); err != nil {
		return nil, fmt.Errorf("pause sandbox %s: %w", rec.ID, err)
	}
	now := s.clock.Now()
	updated, err := s.reg.Update(rec.ID, func(r *store.Record) error {
		r.State, r.PausedAt = registry.StatePaused, now
		return nil
	})
	if err != nil {
		if rerr := s.rt.Resume(ctx, rec.ID); rerr != nil {
			s.log.ErrorContext(ctx, "resume sandbox after failing to record its pause", "sandbox", rec.ID, "error", rerr)
		}
		return nil, fmt.Errorf("record pause of %s: %w", rec.ID, err)
	}
	s.deadlines.Cancel(rec.ID)
	s.log.InfoContext(ctx, "sandbox paused", "sandbox", rec.ID)
	return updated, nil
}

// Resume thaws a paused sandbox, with a new lifetime from now or the one it
// had left when paused.
func (s *Service) Resume(ctx context.Context, req *connect.Request[pb.ResumeRequest]) (*connect.Response[pb.ResumeResponse], error) {
	m := req.Msg
	var f fieldErrors
	checkID(&f, m.GetSandboxId())
	timeout := s.checkTimeout(&f, "timeout", m.GetTimeout(), false)
	if err := f.err(); err != nil {
		return nil, err
	}
	id := m.GetSandboxId()
	defer s.locks.lock(id)()
	rec, err := s.reg.Get(id)
	if err != nil {
		return nil, toConnect(err)
	}
	if rec.State != registry.StatePaused {
		return nil, toConnect(fmt.Errorf("%w: sandbox %s is %s, not paused", errWrongState, id, rec.State))
	}
	lifetime := timeout
	if lifetime == 0 {
		if lifetime = rec.EndAt.Sub(rec.PausedAt); lifetime <= 0 {
			f.add("timeout", "required: sandbox %s was paused at its deadline and has no lifetime left", id)
			return nil, f.err()
		}
	}
	if m.GetReboot() && !rec.FilesOnly {
		// It copies the files, as a pause to them does.
		if err := s.checkDisk("resume with a reboot", s.stateDir); err != nil {
			return nil, toConnect(err)
		}
		if rec, err = s.dropMemoryLocked(ctx, rec); err != nil {
			return nil, toConnect(err)
		}
	}
	if rec, err = s.resumeLocked(ctx, rec, lifetime, timeout != 0); err != nil {
		return nil, toConnect(err)
	}
	s.log.InfoContext(ctx, "sandbox resumed", "sandbox", id, "end_at", rec.EndAt)
	return connect.NewResponse(&pb.ResumeResponse{Sandbox: s.toSandbox(rec)}), nil
}

// dropMemoryLocked turns rec, paused with its memory, into a sandbox
// paused with its files only, for a Resume with reboot. A runtime that
// pauses in place copies it frozen; another (gVisor, whose pause is a
// checkpoint) brings it back to running for a moment, then keeps its files
// only. A host that keeps no snapshots refuses before the thaw; a failure
// after it freezes the sandbox again, so that it is as its record says
// (paused, with no deadline) and a later resume finds it so.
func (s *Service) dropMemoryLocked(ctx context.Context, rec *store.Record) (*store.Record, error) {
	id := rec.ID
	if _, err := s.snapshotter(); err != nil {
		return nil, err
	}
	if _, ok := s.rt.(sandboxrt.InPlacePauser); ok {
		// Frozen in place, it is copied as it is, and never runs.
		return s.pauseFilesLocked(ctx, rec)
	}
	if err := s.rt.Resume(ctx, id); err != nil {
		return nil, fmt.Errorf("resume sandbox %s to reboot it: %w", id, err)
	}
	updated, err := s.pauseFilesLocked(ctx, rec)
	if err != nil {
		// The copy may have taken long enough for the caller to give
		// up: the freeze has a context of its own.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if perr := s.rt.Pause(pctx, id); perr != nil {
			s.log.ErrorContext(ctx, "pause sandbox again after failing to keep its files for a reboot", "sandbox", id, "error", perr)
		}
		return nil, err
	}
	return updated, nil
}

// resumeLocked thaws the paused sandbox rec and records it running until
// now + lifetime; with remember, lifetime also becomes the sandbox's last
// timeout (what an auto-resume gives). The Resume RPC and the relay's
// auto-resume both come here, under the sandbox's lock.
func (s *Service) resumeLocked(ctx context.Context, rec *store.Record, lifetime time.Duration, remember bool) (*store.Record, error) {
	id := rec.ID
	if rec.FilesOnly {
		return s.bootLocked(ctx, rec, lifetime, remember)
	}
	// A checkpoint restores its mounts: their volumes must be mounted on
	// the host (again, after a reboot).
	if _, err := s.holdVolumes(id, rec.Team, rec.VolumeMounts, false); err != nil {
		return nil, fmt.Errorf("resume sandbox %s: mount volumes: %w", id, err)
	}
	if err := s.rt.Resume(ctx, id); err != nil {
		return nil, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	now := s.clock.Now()
	rec, err := s.reg.Update(id, func(r *store.Record) error {
		r.State, r.PausedAt, r.EndAt, r.RunStart = registry.StateRunning, time.Time{}, now.Add(lifetime), now
		if remember {
			r.Timeout = lifetime
		}
		return nil
	})
	if err != nil {
		if perr := s.rt.Pause(ctx, id); perr != nil {
			s.log.ErrorContext(ctx, "pause sandbox again after failing to record its resume", "sandbox", id, "error", perr)
		}
		return nil, fmt.Errorf("record resume of %s: %w", id, err)
	}
	s.deadlines.Set(id, rec.EndAt)
	s.watchExit(id) // a runtime that paused to disk runs a new process
	return rec, nil
}

// expire is the deadline's callback: it kills the sandbox, or pauses it
// with auto-pause. A failure tries again after expireRetry.
func (s *Service) expire(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	defer s.locks.lock(id)()
	rec, err := s.reg.Get(id)
	if err != nil || rec.State != registry.StateRunning {
		return // killed or paused meanwhile
	}
	if s.clock.Now().Before(rec.EndAt) {
		return // SetTimeout moved the deadline while this call waited
	}
	if rec.AutoPause {
		filesOnly := rec.AutoPauseFilesOnly
		_, err = s.pauseLocked(ctx, rec, filesOnly)
		if err != nil && filesOnly {
			// Refused for good (too many layers deep; under gVisor, files
			// too large to copy through the sandbox's memory) or failed
			// part way, the pause would be tried again and again and the
			// sandbox run on past its deadline: a freeze keeps it all.
			s.log.WarnContext(ctx, "a sandbox at its deadline could not be paused to its files; paused with its memory instead",
				"sandbox", id, "error", err)
			// A context of its own: the copy may have used up the first.
			fctx, fcancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer fcancel()
			if cur, gerr := s.reg.Get(id); gerr != nil {
				err = gerr
			} else if cur.State == registry.StateRunning {
				_, err = s.pauseLocked(fctx, cur, false)
			}
		}
	} else {
		err = s.killLocked(ctx, rec, reasonDeadline)
	}
	if err != nil {
		s.log.ErrorContext(ctx, "act on sandbox deadline; trying again later", "sandbox", id, "auto_pause", rec.AutoPause, "error", err, "retry_in", expireRetry)
		s.deadlines.Set(id, s.clock.Now().Add(expireRetry))
	}
}

// validID answers invalid_argument for a malformed sandbox ID.
func validID(id string) error {
	var f fieldErrors
	checkID(&f, id)
	return f.err()
}
