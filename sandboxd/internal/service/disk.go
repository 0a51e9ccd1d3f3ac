package service

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
)

// checkDisk refuses op, which would write to dir's filesystem, when that
// filesystem has less free space than Config.DiskReserveMiB: a host whose
// disk fills fails every sandbox on it (their disks are sparse files, and
// sandboxd's own records are written there), so what adds to it stops
// first, and goes to another host (resource_exhausted). A filesystem it
// cannot measure is not held to it. A refusal the host's inventory does
// not show yet is announced at once (notePressure), so that placement
// stops sending it more.
func (s *Service) checkDisk(op, dir string) error {
	free, low := s.diskLow(dir)
	if !low {
		return nil
	}
	s.notePressure()
	return fmt.Errorf("%w: %s: this host's disk is nearly full: %d MiB free on %s, below its reserve of %d MiB (--disk-reserve)",
		registry.ErrExhausted, op, free>>20, dir, s.cfg.DiskReserveMiB)
}

// diskLow measures dir's filesystem: its free space (as df's Avail) and
// whether that is below Config.DiskReserveMiB. Off (a reserve of 0), no
// dir, or a filesystem that cannot be measured is never low.
func (s *Service) diskLow(dir string) (free int64, low bool) {
	if s.cfg.DiskReserveMiB <= 0 || dir == "" {
		return 0, false
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		s.log.Warn("cannot measure a filesystem's free space for --disk-reserve", "dir", dir, "error", err)
		return 0, false
	}
	// Free blocks are in fragment units (df's), which some filesystems
	// (FUSE's) report smaller than Bsize.
	unit := st.Frsize
	if unit <= 0 {
		unit = st.Bsize
	}
	free = int64(st.Bavail) * unit //nolint:gosec // a filesystem's size fits
	return free, free < s.cfg.DiskReserveMiB<<20
}

// diskPressure is what Info reports of the host's two filesystems: the
// state directory's (sandboxes, snapshots) and the volume store's.
type diskPressure struct{ state, volumes bool }

// measurePressure measures both filesystems now.
func (s *Service) measurePressure() diskPressure {
	var p diskPressure
	_, p.state = s.diskLow(s.stateDir)
	if s.volumes != nil {
		_, p.volumes = s.diskLow(s.volumes.Dir())
	}
	return p
}

// notePressure measures both filesystems and, when that differs from what
// the Watch streams last heard, keeps it (Info reports it) and tells them
// (HostChanged), so that the host's inventory is written again. Measures
// are serialised, so that an older one never overwrites a newer.
func (s *Service) notePressure() {
	s.pressureMu.Lock()
	p := s.measurePressure()
	changed := p != s.pressure
	s.pressure = p
	s.pressureMu.Unlock()
	if changed {
		s.log.Info("disk pressure changed", "state", p.state, "volumes", p.volumes, "reserve_mib", s.cfg.DiskReserveMiB)
		s.hostChanged.notify()
	}
}

// lastPressure is the pressure last measured, which Info reports: Info
// does not touch the filesystems itself (a hung shared volume store would
// hang it, and with it the host's inventory).
func (s *Service) lastPressure() diskPressure {
	s.pressureMu.Lock()
	defer s.pressureMu.Unlock()
	return s.pressure
}

// watchDisk measures the host's filesystems every interval (New measured
// them at start) until ctx ends, announcing a change of pressure either
// way: a disk that fills by what running sandboxes write, or frees as
// snapshots and volumes go, reaches the inventory in an interval, as a
// kubelet's DiskPressure does.
func (s *Service) watchDisk(ctx context.Context, interval time.Duration) {
	if s.cfg.DiskReserveMiB <= 0 || interval <= 0 {
		return
	}
	t := s.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		s.notePressure()
	}
}
