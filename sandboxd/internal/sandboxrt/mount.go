package sandboxrt

import (
	"errors"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// IsMountPoint reports whether path is a mount point (its device differs
// from its parent's).
func IsMountPoint(path string) bool {
	var a, b unix.Stat_t
	if unix.Lstat(path, &a) != nil || unix.Lstat(filepath.Dir(path), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// Unmount detaches the mount at path; nothing mounted there, or no path,
// is no error.
func Unmount(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
