package service

import (
	"context"
	"errors"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
)

// A sandbox can end by itself: its envd (the sandbox's init) dies, OOM-
// killed or crashed, and with it every process in it. Nothing asked for
// that, so nothing would notice: the record would say running until the
// deadline, holding capacity and the team's count, and lists (the e2b API,
// kubectl) would show a sandbox that answers nothing. With a runtime that
// can watch its sandboxes' inits (sandboxrt.ExitWatcher), each running
// sandbox has a goroutine waiting for its init to exit, without a thread
// of its own; when it does and the runtime says the sandbox is stopped,
// the sandbox is ended as a kill would (reason "died"), its Watch delete
// says why, and so does sandboxd's log.

// reasonDied is the kill reason of a sandbox that ended by itself.
const reasonDied = "died"

// exitRetry is how long a watcher waits before watching again when the
// runtime could not say how the sandbox is.
const exitRetry = 5 * time.Second

// watchExit starts watching sandbox id's init, unless it is watched
// already or the runtime cannot watch. Callers hold the sandbox's lock.
func (s *Service) watchExit(id string) {
	ew, ok := s.rt.(sandboxrt.ExitWatcher)
	if !ok {
		return
	}
	s.exitMu.Lock()
	defer s.exitMu.Unlock()
	if _, ok := s.watching[id]; ok || s.exitCtx.Err() != nil {
		return
	}
	s.watching[id] = struct{}{}
	s.exitWG.Go(func() { s.exitLoop(ew, id) })
}

func (s *Service) exitLoop(ew sandboxrt.ExitWatcher, id string) {
	for {
		exit, err := ew.WaitExit(s.exitCtx, id)
		if s.exitCtx.Err() != nil {
			return
		}
		again, wait := s.afterExit(id, exit, err)
		if !again {
			return
		}
		if wait > 0 {
			select {
			case <-s.exitCtx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

// afterExit decides, under the sandbox's lock, what the return of its
// init's wait means: a sandbox that is stopped died, and is ended; one
// that runs (or is paused with its processes) is watched on; one with
// nothing to watch (killed meanwhile, paused to disk) is not. It reports
// whether to watch again, and after how long.
func (s *Service) afterExit(id string, exit sandboxrt.Exit, waitErr error) (again bool, wait time.Duration) {
	defer s.locks.lock(id)()
	defer func() {
		if !again {
			s.exitMu.Lock()
			delete(s.watching, id)
			s.exitMu.Unlock()
		}
	}()
	rec, err := s.reg.Get(id)
	if err != nil {
		return false, 0 // killed meanwhile
	}
	if rec.FilesOnly {
		return false, 0 // paused with its files only: its stop ended the init; a boot watches again
	}
	ctx, cancel := context.WithTimeout(s.exitCtx, cleanupTimeout)
	defer cancel()
	st, err := s.rt.Status(ctx, id)
	switch {
	case errors.Is(err, sandboxrt.ErrNotFound), err == nil && st == sandboxrt.Stopped:
		if err := s.endedLocked(ctx, rec, exit); err != nil {
			s.log.ErrorContext(ctx, "clean up a sandbox that died; trying again later", "sandbox", id, "error", err, "retry_in", exitRetry)
			return true, exitRetry
		}
		return false, 0
	case err != nil:
		s.log.WarnContext(ctx, "read the status of a sandbox whose init's wait returned; watching again later", "sandbox", id, "error", err, "retry_in", exitRetry)
		return true, exitRetry
	case waitErr != nil && st == sandboxrt.Running:
		s.log.WarnContext(ctx, "watch a sandbox's init; trying again later", "sandbox", id, "error", waitErr, "retry_in", exitRetry)
		return true, exitRetry
	case waitErr != nil:
		return false, 0 // paused with no process to watch: Resume watches again
	default:
		return true, 0
	}
}

// endedLocked ends a sandbox that died by itself: as a kill would, but
// its Watch delete and sandboxd's log say why.
func (s *Service) endedLocked(ctx context.Context, rec *store.Record, exit sandboxrt.Exit) error {
	why := exit.String()
	attrs := []any{"sandbox", rec.ID, "team", rec.Team, "template", rec.Template, "state", rec.State, "why", why, "oom_kills", exit.OOMKills}
	if exit.Known {
		attrs = append(attrs, "exit_code", exit.Code, "signal", int(exit.Signal))
	}
	s.log.WarnContext(ctx, "sandbox ended by itself", attrs...)
	return s.endLocked(ctx, rec, reasonDied, "the sandbox died: "+why)
}
