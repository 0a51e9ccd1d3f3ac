package sandboxrt

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

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

// MaxLayers is the most snapshot layers a sandbox's root may stack above
// its template: overlayfs stacks at most 500 lower layers, the template
// one of them.
const MaxLayers = 499

// MountOverlay mounts at target an overlay of lowers (topmost first), with
// upper and work as its writable layer, or read-only when upper is "".
// From Linux 6.8 each lower is its own fsconfig call (overlayfs's
// lowerdir+), so a stack is bounded by overlayfs's 500 layers, not by
// mount(2)'s one page of options (about 60 layers by path, 200 by
// descriptor, which a sandbox paused to its files or snapshotted again
// and again passes). Older kernels get mount(2): before 6.5 fsopen gives
// overlayfs a generic context that takes any key and fails only at the
// end, so no call can tell.
func MountOverlay(target string, lowers []string, upper, work string) error {
	if len(lowers) > MaxLayers+1 {
		return fmt.Errorf("mount overlay: %d lower layers, the most is %d", len(lowers), MaxLayers+1)
	}
	if LowerdirPlus() {
		// A seccomp profile around sandboxd may refuse the new mount
		// calls and allow mount(2).
		if err := fsconfigOverlay(target, lowers, upper, work); !errors.Is(err, errNoFsopen) {
			return err
		}
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	flags := uintptr(unix.MS_NODEV)
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	} else {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay (%d layers): %w", len(lowers), err)
	}
	return nil
}

// LowerdirPlus reports whether this kernel's overlayfs takes its layers
// one by one (Linux 6.8).
var LowerdirPlus = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 6, 8)
})

// kernelAtLeast reports whether release ("6.8.0-45-generic") is major.minor
// or later.
func kernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// errNoFsopen: fsopen is refused (ENOSYS, EPERM: a seccomp profile).
var errNoFsopen = errors.New("fsopen refused")

func fsconfigOverlay(target string, lowers []string, upper, work string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		return errNoFsopen
	}
	if err != nil {
		return fmt.Errorf("mount overlay: fsopen: %w", err)
	}
	defer unix.Close(fd)
	for i, l := range lowers {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			return fmt.Errorf("mount overlay: layer %d of %d (%s): %w", i+1, len(lowers), l, err)
		}
	}
	attrs := unix.MOUNT_ATTR_NODEV
	if upper != "" {
		if err := unix.FsconfigSetString(fd, "upperdir", upper); err != nil {
			return fmt.Errorf("mount overlay: upperdir %s: %w", upper, err)
		}
		if err := unix.FsconfigSetString(fd, "workdir", work); err != nil {
			return fmt.Errorf("mount overlay: workdir %s: %w", work, err)
		}
	} else {
		attrs |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("mount overlay (%d layers): %w", len(lowers), err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fmt.Errorf("mount overlay: fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", target, err)
	}
	return nil
}
