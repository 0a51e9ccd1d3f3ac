package native

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/shared/mountinfo"
)

// The base mount namespace (patch 0006 of the runc fork): a sandbox's mount
// namespace is made as a copy of this one rather than of sandboxd's. The
// kernel copies every mount of the namespace a new one is made from, and
// the init's pivot_root unmounts them all again; sandboxd's namespace holds
// three mounts for each running sandbox (its root, its disk, its network
// namespace), so that each start cost more the more sandboxes ran (at
// 1,000: 7 ms of unshare, 3 ms of pivot_root and 1 ms of unmounting the old
// root, against 0.4, 0.2 and 0.1 ms with none). The base namespace is a
// copy of sandboxd's made when the runtime opens, with every mount below
// the directories where sandboxd mounts things per sandbox or volume
// removed, and private: no mount made on the host later reaches it. The
// sandbox's root is carried into its namespace as a detached copy.

// Goroutines that move their thread into another namespace and leave it
// there (onThrowawayThread: the base namespace, the boot ID's mount, the
// envd listener) end that thread by exiting locked to it. The main thread cannot end: the Go runtime parks
// it instead, still in that namespace, and /proc/self, which is the main
// thread's, then shows that namespace to the whole process (its mountinfo,
// its net). Keeping the main goroutine on the main thread keeps every
// other goroutine off it.
func init() { runtime.LockOSThread() }

// openBaseMountNS makes the base mount namespace without the mounts below
// each of private (those at or above any of them stay) and returns a descriptor that
// holds it: it lives as long as the descriptor is open.
func openBaseMountNS(private []string) (*os.File, error) {
	var dirs []string
	for _, d := range private {
		d, err := mountinfo.Resolve(d)
		if err != nil {
			return nil, err
		}
		if d == "/" {
			return nil, errors.New("base mount namespace: / cannot be a directory of sandboxd's own mounts")
		}
		dirs = append(dirs, d)
	}
	f, err := onThrowawayThread(func() (*os.File, error) {
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			return nil, fmt.Errorf("unshare: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return nil, fmt.Errorf("make it private: %w", err)
		}
		info, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return nil, err
		}
		var below []string
		for _, d := range dirs {
			for _, mp := range mountinfo.ParseUnder(info, d) {
				if !holds(mp, dirs) {
					below = append(below, mp)
				}
			}
		}
		// The shallowest first: detaching a mount detaches those
		// below it, whose own unmount then finds nothing (EINVAL);
		// each path until none is left at it (stacked mounts).
		slices.SortStableFunc(below, func(a, b string) int { return strings.Count(a, "/") - strings.Count(b, "/") })
		for _, mp := range below {
			for {
				err := unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
				if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
					break
				}
				if err != nil {
					return nil, fmt.Errorf("unmount %s: %w", mp, err)
				}
			}
		}
		return os.Open("/proc/thread-self/ns/mnt")
	})
	if err != nil {
		return nil, fmt.Errorf("base mount namespace: %w", err)
	}
	return f, nil
}

// holds reports whether a mount at mp holds one of dirs (is at it or
// above it): one of them may be a mount of its own below another (the
// runtime's directory on a filesystem of its own, below the run
// directory), and the base keeps the mounts of each.
func holds(mp string, dirs []string) bool {
	for _, d := range dirs {
		if mp == d || strings.HasPrefix(d, mp+"/") {
			return true
		}
	}
	return false
}

// nsFDPath is a path another process (the sandbox's init) opens f by.
func nsFDPath(f *os.File) string {
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
}
