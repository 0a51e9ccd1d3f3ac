package service

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
)

// checkDisk refuses op, which would write to dir's filesystem, when that
// filesystem has less free space than Config.DiskReserveMiB: a host whose
// disk fills fails every sandbox on it (their disks are sparse files, and
// sandboxd's own records are written there), so what adds to it stops
// first, and goes to another host (resource_exhausted). A filesystem it
// cannot measure is not held to it.
func (s *Service) checkDisk(op, dir string) error {
	if s.cfg.DiskReserveMiB <= 0 || dir == "" {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		s.log.Warn("cannot measure a filesystem's free space for --disk-reserve", "dir", dir, "error", err)
		return nil
	}
	// Free blocks are in fragment units (df's), which some filesystems
	// (FUSE's) report smaller than Bsize.
	unit := st.Frsize
	if unit <= 0 {
		unit = st.Bsize
	}
	free := int64(st.Bavail) * unit //nolint:gosec // a filesystem's size fits
	if free >= s.cfg.DiskReserveMiB<<20 {
		return nil
	}
	return fmt.Errorf("%w: %s: this host's disk is nearly full: %d MiB free on %s, below its reserve of %d MiB (--disk-reserve)",
		registry.ErrExhausted, op, free>>20, dir, s.cfg.DiskReserveMiB)
}
