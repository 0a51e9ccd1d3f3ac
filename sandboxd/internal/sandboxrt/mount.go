package sandboxrt

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
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
// mount(2)'s one page of options (about 60 layers by their paths under
// gVisor, 200 natively by /proc/self/fd/N, which a sandbox paused to its
// files or snapshotted again and again passes). Older kernels get
// mount(2): before 6.5 fsopen gives overlayfs a generic context that
// takes any key and fails only at the end, so no call can tell. Options past a page are given by short
// relative names (mountByDescriptors), so that overlayfs's bound holds
// there too.
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
	flags := uintptr(unix.MS_NODEV)
	if upper == "" {
		flags |= unix.MS_RDONLY
	}
	opts := overlayOptions(lowers, upper, work)
	if len(opts) >= unix.Getpagesize() {
		// mount(2) copies one page of options: name each layer by a
		// descriptor of this process, relative to /proc/self/fd.
		return mountByDescriptors(target, lowers, upper, work, flags)
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay (%d layers): %w", len(lowers), err)
	}
	return nil
}

// overlayOptions are mount(2)'s options for an overlay of lowers (topmost
// first) with upper and work, or read-only when upper is "".
func overlayOptions(lowers []string, upper, work string) string {
	opts := "lowerdir=" + strings.Join(lowers, ":")
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	}
	return opts
}

// mountByDescriptors mounts an overlay whose options by path pass a page:
// each layer is opened (O_PATH; one given as /proc/self/fd/N is N), and
// mount(2) is called on a thread of its own whose working directory is
// /proc/self/fd, with each layer named by its descriptor's number,
// relative to it ("12:13:…", at most eight bytes a layer), as Docker's
// overlay2 driver names its layers by short paths relative to its own
// directory. So a stack of up to MaxLayers starts on kernels before 6.8
// too.
func mountByDescriptors(target string, lowers []string, upper, work string, flags uintptr) error {
	// The other paths are resolved from that working directory too.
	for _, p := range []*string{&target, &upper, &work} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("mount overlay: %w", err)
		}
		*p = abs
	}
	names := make([]string, 0, len(lowers))
	fds := make([]int, 0, len(lowers))
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	for _, l := range lowers {
		if n, ok := strings.CutPrefix(l, "/proc/self/fd/"); ok {
			if _, err := strconv.Atoi(n); err == nil {
				names = append(names, n) // held open by the caller
				continue
			}
		}
		fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mount overlay: open layer %s: %w", l, err)
		}
		fds = append(fds, fd)
		names = append(names, strconv.Itoa(fd))
	}
	opts := overlayOptions(names, upper, work)
	if len(opts) >= unix.Getpagesize() {
		return fmt.Errorf("mount overlay (%d layers): its options are %d bytes by descriptor, more than a page", len(lowers), len(opts))
	}
	done := make(chan error, 1)
	go func() {
		// The thread's working directory becomes its own (unshare
		// CLONE_FS); the thread is never unlocked, so it ends with this
		// goroutine and no other goroutine runs in that directory.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("mount overlay: unshare the working directory: %w", err)
			return
		}
		if err := unix.Chdir("/proc/self/fd"); err != nil {
			done <- fmt.Errorf("mount overlay: %w", err)
			return
		}
		if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
			done <- fmt.Errorf("mount overlay (%d layers, by descriptor): %w", len(lowers), err)
			return
		}
		done <- nil
	}()
	return <-done
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
