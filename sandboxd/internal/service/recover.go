package service

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// Recover re-adopts the sandboxes the records name, as a restarted
// sandboxd must before it serves: a sandbox the runtime still runs (or
// holds paused) gets its address back and its deadline re-armed (one that
// passed while sandboxd was down fires at once); a sandbox that is gone is
// cleaned up and its record removed (a Watch delete). Then whatever the
// runtime or the network holds without a record is stopped or torn down.
//
// A sandbox whose status cannot be read is left alone, record and all: a
// passing error must not cost it.
func (s *Service) Recover(ctx context.Context) error {
	var errs []error
	adopted, gone := 0, 0
	// Leases first: their volumes are mounted (again, after a reboot)
	// before a sandbox is resumed on them.
	s.reconcileLeases(ctx)
	for _, rec := range s.reg.List() {
		ok, err := s.recoverOne(ctx, rec)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			adopted++
		} else if err == nil {
			gone++
		}
	}
	orphans, err := s.sweepOrphans(ctx)
	errs = append(errs, err)
	// Layers of snapshots deleted while their last sandbox ran, or whose
	// capture a crash cut short.
	s.gcLayers(ctx)
	s.reconcileLeases(ctx) // of the sandboxes found gone
	s.recovered.Store(true)
	s.log.InfoContext(ctx, "recovered sandboxes", "adopted", adopted, "gone", gone, "orphans", orphans)
	return errors.Join(errs...)
}

// recoverOne re-adopts one sandbox, or cleans it up when the runtime no
// longer has it. It reports whether the sandbox lives on.
func (s *Service) recoverOne(ctx context.Context, rec *store.Record) (bool, error) {
	defer s.locks.lock(rec.ID)()
	if rec.State == registry.StatePaused && rec.FilesOnly {
		s.recoverFilesOnly(ctx, rec)
		return true, nil
	}
	log := s.log.With("sandbox", rec.ID)
	st, err := s.rt.Status(ctx, rec.ID)
	switch {
	case errors.Is(err, sandboxrt.ErrNotFound):
		st = sandboxrt.Stopped
	case err != nil:
		log.ErrorContext(ctx, "read sandbox status; leaving it as recorded", "error", err)
		s.adopt(ctx, rec)
		return true, fmt.Errorf("status of sandbox %s: %w", rec.ID, err)
	}
	if st == sandboxrt.Stopped && rec.State == registry.StatePaused {
		// A pause that kept memory whose processes are gone (the host
		// rebooted): its files can still be kept.
		if salvaged, err := s.salvageLocked(ctx, rec); err == nil {
			log.WarnContext(ctx, "a paused sandbox's processes are gone (a host reboot?); kept its files, and its next resume boots it afresh",
				"team", rec.Team, "layers", len(salvaged.Layers))
			return true, nil
		} else if !errors.Is(err, errCannotSalvage) {
			log.ErrorContext(ctx, "keep the files of a paused sandbox whose processes are gone", "error", err)
		}
	}
	if st == sandboxrt.Stopped {
		log.WarnContext(ctx, "sandbox is gone; removing its record", "state", rec.State, "team", rec.Team)
		if err := s.rt.Stop(ctx, rec.ID); err != nil {
			return false, fmt.Errorf("stop gone sandbox %s: %w", rec.ID, err)
		}
		s.releaseNetwork(ctx, rec)
		if err := s.reg.Remove(rec.ID); err != nil {
			return false, fmt.Errorf("remove record of gone sandbox %s: %w", rec.ID, err)
		}
		_ = os.Remove(s.logPath(rec.ID))
		return false, nil
	}
	if err := s.reconcile(ctx, rec, st); err != nil {
		log.ErrorContext(ctx, "bring sandbox to its recorded state", "state", rec.State, "runtime", st.String(), "error", err)
	}
	s.adopt(ctx, rec)
	if st == sandboxrt.Paused {
		s.restoreNetworkOf(ctx, rec)
	}
	s.reapplyRules(ctx, rec)
	return true, nil
}

// reapplyRules sets rec's outbound rules again: the nftables table was
// rebuilt when this sandboxd started, without any sandbox's own chain.
func (s *Service) reapplyRules(ctx context.Context, rec *store.Record) {
	if _, restricted := policyOf(rec); !restricted {
		return
	}
	b, err := s.blockOf(rec)
	if err != nil {
		return
	}
	if ids, err := s.net.List(); err != nil || !slices.Contains(ids, rec.ID) {
		return // no network to apply them to (restoreNetworkOf's work)
	}
	if err := s.applyRules(rec.ID, rec, b); err != nil {
		s.log.ErrorContext(ctx, "re-apply a sandbox's outbound rules; until they are, it reaches its resolvers only", "sandbox", rec.ID, "error", err)
	}
}

// errCannotSalvage is a sandbox whose files cannot be kept: the runtime
// keeps nothing of a stopped sandbox, or the host keeps no snapshots.
var errCannotSalvage = errors.New("the sandbox's files cannot be kept")

// salvageLocked turns rec, paused with its memory but whose processes are
// gone, into a sandbox paused with its files only (see reboot.go): its
// writable layer, still on disk, becomes a layer of the snapshot store.
func (s *Service) salvageLocked(ctx context.Context, rec *store.Record) (*store.Record, error) {
	sv, ok := s.rt.(sandboxrt.Salvager)
	if !ok || s.snapshots == nil {
		return nil, errCannotSalvage
	}
	layerID, tmp, err := s.snapshots.NewLayer()
	if err != nil {
		return nil, err
	}
	// Held from sweeps until the record names it, as a capture's.
	defer s.hold(layerID)()
	if err := sv.SalvageLayer(ctx, rec.ID, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	if err := s.snapshots.CommitLayer(layerID, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	updated, err := s.reg.Update(rec.ID, func(r *store.Record) error {
		r.FilesOnly = true
		r.Layers = append([]string{layerID}, r.Layers...)
		if r.RootfsPath == "" {
			r.RootfsPath = s.rootfsOf(r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record the salvaged files of %s: %w", rec.ID, err)
	}
	if n := len(updated.Layers); n > sandboxrt.MaxLayers {
		// Snapshots, forks and pauses to files stop a layer short of
		// MaxLayers for this layer; a sandbox salvaged before, resumed
		// and paused with its memory again is past it. Its files are
		// kept all the same, on disk for an operator.
		s.log.ErrorContext(ctx, "a paused sandbox's files were kept after a host reboot, past the layers a sandbox starts on: it cannot resume",
			"sandbox", rec.ID, "layers", n, "most", sandboxrt.MaxLayers, "upper_layer", s.snapshots.LayerPath(layerID))
	}
	s.stopForFiles(ctx, updated)
	if _, err := s.blockOf(updated); err != nil {
		s.log.ErrorContext(ctx, "claim sandbox address", "sandbox", rec.ID, "error", err)
	}
	return updated, nil
}

// restoreNetworkOf makes the network namespace of rec, paused to disk,
// again when it is gone (a host reboot empties --run-dir), so that its
// resume finds it as it was.
func (s *Service) restoreNetworkOf(ctx context.Context, rec *store.Record) {
	ids, err := s.net.List()
	if err != nil || slices.Contains(ids, rec.ID) {
		return
	}
	b, err := s.blockOf(rec)
	if err != nil {
		s.log.ErrorContext(ctx, "find sandbox address", "sandbox", rec.ID, "error", err)
		return
	}
	if _, err := s.setupNetwork(ctx, rec.ID, rec, b); err != nil {
		s.log.ErrorContext(ctx, "set up the network of a paused sandbox again", "sandbox", rec.ID, "error", err)
		return
	}
	s.log.WarnContext(ctx, "a paused sandbox's network was gone (a host reboot?); made it again", "sandbox", rec.ID)
}

// reconcile makes the runtime match the record, which is what callers were
// told: a crash between the runtime's pause and the record's leaves a
// running record over a paused sandbox, and the record wins.
func (s *Service) reconcile(ctx context.Context, rec *store.Record, st sandboxrt.Status) error {
	wantPaused := rec.State == registry.StatePaused
	switch {
	case wantPaused && st == sandboxrt.Running:
		return s.rt.Pause(ctx, rec.ID)
	case !wantPaused && st == sandboxrt.Paused:
		return s.rt.Resume(ctx, rec.ID)
	}
	return nil
}

// adopt claims the sandbox's address again and re-arms its deadline.
func (s *Service) adopt(ctx context.Context, rec *store.Record) {
	if _, err := s.blockOf(rec); err != nil {
		s.log.ErrorContext(ctx, "claim sandbox address", "sandbox", rec.ID, "error", err)
	}
	if rec.State == registry.StateRunning && !rec.EndAt.IsZero() {
		s.deadlines.Set(rec.ID, rec.EndAt)
	}
	s.watchExit(rec.ID)
}

// sweepOrphans stops the runtime's sandboxes and tears down the networks
// that no record names: leftovers of a create that sandboxd died in.
func (s *Service) sweepOrphans(ctx context.Context) (int, error) {
	known := map[string]bool{}
	for _, rec := range s.reg.List() {
		known[rec.ID] = true
	}
	var errs []error
	orphans := map[string]bool{}
	ids, err := s.rt.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list runtime sandboxes: %w", err))
	}
	for _, id := range ids {
		if known[id] {
			continue
		}
		orphans[id] = true
		s.log.WarnContext(ctx, "stopping sandbox without a record", "sandbox", id)
		if err := s.rt.Stop(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("stop orphan sandbox %s: %w", id, err))
		}
		_ = os.Remove(s.logPath(id))
	}
	nets, err := s.net.List()
	if err != nil {
		errs = append(errs, fmt.Errorf("list sandbox networks: %w", err))
	}
	for _, id := range nets {
		if known[id] {
			continue
		}
		orphans[id] = true
		s.log.WarnContext(ctx, "tearing down network without a record", "sandbox", id)
		if err := s.net.Teardown(ctx, id, ipam.Block{}); err != nil {
			errs = append(errs, fmt.Errorf("tear down orphan network %s: %w", id, err))
		}
	}
	s.sweepLogs(ctx, known)
	return len(orphans), errors.Join(errs...)
}

// sweepLogs removes the logs of sandboxes that no record names.
func (s *Service) sweepLogs(ctx context.Context, known map[string]bool) {
	entries, err := os.ReadDir(s.logDir)
	if err != nil {
		s.log.WarnContext(ctx, "list sandbox logs", "error", err)
		return
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		// A link: the native runtime keeps a log on the sandbox's disk.
		if ok && (e.Type().IsRegular() || e.Type()&fs.ModeSymlink != 0) && sandboxid.Valid(id) && !known[id] {
			_ = os.Remove(filepath.Join(s.logDir, e.Name()))
		}
	}
}
