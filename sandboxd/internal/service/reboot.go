package service

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/envdlog"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// A pause that keeps the files only (e2b's pause with memory: false) copies
// the sandbox's writable layer into a layer of the snapshot store, exactly
// as a snapshot does, records the sandbox paused on that layer, and then
// stops it: its processes end, its memory, cgroup, disk and network go,
// and only its record, its address and its layers are left. The next
// Resume boots it afresh on those layers: a new root, a new network
// namespace at the same address, envd given the same token and
// environment again. The record is written before the runtime stops, so a
// sandboxd killed in between finds the sandbox paused and stops what is
// left of it; a host reboot loses nothing of such a sandbox.

// maxMadeLayers is the deepest a snapshot, a fork or a pause to files
// (asked, or at the deadline) stacks a sandbox's files: one below what a
// sandbox can start from (sandboxrt.MaxLayers), since a sandbox paused with
// its memory when the host reboots keeps its files as one more layer
// (salvageLocked), and must still resume.
const maxMadeLayers = sandboxrt.MaxLayers - 1

// checkDepth refuses a new layer on rec's files (a snapshot, a fork, a
// pause to its files) that would stack them deeper than maxMadeLayers.
func checkDepth(rec *store.Record) error {
	if tooDeep(rec) {
		return stateError(fmt.Sprintf("its files are %d layers deep (each snapshot of it, and each pause to its files, adds one), the most a snapshot, a fork or a pause to files stacks",
			len(rec.Layers)))
	}
	return nil
}

// tooDeep reports whether rec's files are too deep for another layer made
// of them (checkDepth).
func tooDeep(rec *store.Record) bool { return len(rec.Layers) >= maxMadeLayers }

// pauseFilesLocked pauses rec (running, or native and frozen) keeping its
// files only.
func (s *Service) pauseFilesLocked(ctx context.Context, rec *store.Record) (*store.Record, error) {
	sn, err := s.snapshotter()
	if err != nil {
		return nil, err
	}
	id := rec.ID
	if err := checkDepth(rec); err != nil {
		return nil, fmt.Errorf("pause sandbox %s with its files: %w", id, err)
	}
	began := time.Now()
	// Frozen from the copy to the stop where the runtime can: a sandbox
	// that ran on after the copy would lose what it wrote meanwhile.
	thaw := func() {}
	if _, ok := s.rt.(sandboxrt.InPlacePauser); ok && rec.State == registry.StateRunning {
		if err := s.rt.Pause(ctx, id); err != nil {
			return nil, fmt.Errorf("pause sandbox %s with its files: freeze it: %w", id, err)
		}
		thaw = func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if err := s.rt.Resume(tctx, id); err != nil {
				s.log.ErrorContext(ctx, "thaw a sandbox whose pause to its files failed", "sandbox", id, "error", err)
			}
		}
	}
	layerID, release, err := s.captureLayer(ctx, sn, id)
	if err != nil {
		thaw()
		return nil, fmt.Errorf("pause sandbox %s with its files: copy them: %w", id, err)
	}
	now := s.clock.Now()
	updated, err := s.reg.Update(id, func(r *store.Record) error {
		r.State, r.PausedAt, r.FilesOnly = registry.StatePaused, now, true
		r.Layers = append([]string{layerID}, r.Layers...)
		if r.RootfsPath == "" {
			r.RootfsPath = s.rootfsOf(r)
		}
		return nil
	})
	release() // the record names it, or it goes at the sweep below
	if err != nil {
		thaw()
		s.gcLayers(ctx)
		return nil, fmt.Errorf("record pause of %s: %w", id, err)
	}
	s.deadlines.Cancel(id)
	s.stopForFiles(ctx, updated)
	s.log.InfoContext(ctx, "sandbox paused with its files only", "sandbox", id, "layers", len(updated.Layers), "duration", time.Since(began))
	return updated, nil
}

// stopForFiles ends what runs of a sandbox paused with its files only: its
// processes, runtime state and network. A failure is logged: the sandbox
// is paused either way, and the next start's recovery tries again.
func (s *Service) stopForFiles(ctx context.Context, rec *store.Record) {
	if err := s.rt.Stop(ctx, rec.ID); err != nil {
		s.log.ErrorContext(ctx, "stop a sandbox paused with its files only", "sandbox", rec.ID, "error", err)
	}
	b, err := s.blockOf(rec)
	if err != nil {
		s.log.ErrorContext(ctx, "find sandbox address", "sandbox", rec.ID, "error", err)
		return
	}
	s.forgetEgress(b)
	if err := s.net.Teardown(ctx, rec.ID, b); err != nil {
		s.log.ErrorContext(ctx, "tear down the network of a sandbox paused with its files only", "sandbox", rec.ID, "error", err)
	}
	s.samples.Forget(rec.ID)
}

// bootLocked starts rec, paused with its files only, afresh on its layers
// and records it running until now + lifetime (with remember, lifetime is
// also its last timeout). On failure nothing of the new start is left and
// the sandbox stays paused.
func (s *Service) bootLocked(ctx context.Context, rec *store.Record, lifetime time.Duration, remember bool) (_ *store.Record, err error) {
	id := rec.ID
	began := time.Now()
	block, err := s.blockOf(rec)
	if err != nil {
		return nil, err
	}
	l := &launch{
		kind:    kindCreate,
		tmpl:    &template.Template{Name: rec.Template, Version: rec.TemplateVersion, Rootfs: rec.RootfsPath},
		cpu:     rec.CPUMilli,
		mem:     rec.MemoryMiB,
		disk:    rec.DiskMiB,
		envVars: rec.EnvVars,
		layers:  s.layerPaths(rec.Layers),
	}
	if err := checkRootfs(l.tmpl.Rootfs); err != nil {
		return nil, fmt.Errorf("boot sandbox %s: %w", id, err)
	}
	if n := len(rec.Layers); n > sandboxrt.MaxLayers {
		// Only a second host reboot's salvage in a row makes one (see
		// salvageLocked).
		return nil, stateError(fmt.Sprintf("sandbox %s cannot start: its files are %d layers deep, past the %d a sandbox starts on (a host reboot kept them as one more layer)",
			id, n, sandboxrt.MaxLayers))
	}
	if l.volumes, err = s.holdVolumes(id, rec.Team, rec.VolumeMounts, false); err != nil {
		return nil, fmt.Errorf("boot sandbox %s: mount volumes: %w", id, err)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			s.stopForFiles(cctx, rec)
		}
	}()
	netns, err := s.setupNetwork(ctx, id, rec, block)
	if err != nil {
		return nil, fmt.Errorf("boot sandbox %s: set up network: %w", id, err)
	}
	if err := envdlog.Trim(s.logPath(id), maxLogBytes, keptLogBytes); err != nil {
		s.log.WarnContext(ctx, "could not trim the sandbox's log before it boots again", "sandbox", id, "error", err)
	}
	if err := s.rt.Start(ctx, s.spec(id, l, block, netns, s.logPath(id))); err != nil {
		return nil, fmt.Errorf("boot sandbox %s: %w", id, err)
	}
	if _, _, err := s.initEnvd(ctx, id, l, block, rec.EnvdAccessToken); err != nil {
		return nil, fmt.Errorf("boot sandbox %s: %w", id, err)
	}
	now := s.clock.Now()
	endAt := now.Add(lifetime)
	updated, err := s.reg.Update(id, func(r *store.Record) error {
		r.State, r.PausedAt, r.EndAt, r.FilesOnly, r.RunStart = registry.StateRunning, time.Time{}, endAt, false, now
		r.Boots++
		if remember {
			r.Timeout = lifetime
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record boot of %s: %w", id, err)
	}
	s.deadlines.Set(id, endAt)
	s.watchExit(id)
	s.log.InfoContext(ctx, "sandbox booted on its files", "sandbox", id, "layers", len(updated.Layers), "duration", time.Since(began))
	return updated, nil
}

// recoverFilesOnly re-adopts a sandbox paused with its files only: it
// stops whatever a sandboxd killed between the pause's record and its stop
// left running, tears down the network it left (also when the runtime
// had already stopped the sandbox: its next boot sets up a new one), and
// keeps the record.
func (s *Service) recoverFilesOnly(ctx context.Context, rec *store.Record) {
	if st, err := s.rt.Status(ctx, rec.ID); err == nil && st != sandboxrt.Stopped {
		s.log.WarnContext(ctx, "stopping what runs of a sandbox paused with its files only", "sandbox", rec.ID, "runtime", st.String())
		s.stopForFiles(ctx, rec)
	} else if ids, err := s.net.List(); err == nil && slices.Contains(ids, rec.ID) {
		s.log.WarnContext(ctx, "tearing down the network left by a sandbox paused with its files only", "sandbox", rec.ID)
		s.stopForFiles(ctx, rec)
	}
	if _, err := s.blockOf(rec); err != nil {
		s.log.ErrorContext(ctx, "claim sandbox address", "sandbox", rec.ID, "error", err)
	}
}
