package files

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// openFile is os.OpenFile, except that it never passes through a magic link:
// /proc/<pid>/fd/N, /proc/<pid>/exe, /proc/<pid>/root and the like, and so
// /dev/fd/N and /dev/stdout. envd runs the file requests in its own process,
// whose descriptors include the host's log file on its stdout (docs/envd.md);
// a path through /proc/self/fd/1, or a link to it that a process of the
// sandbox planted, would otherwise write that file past the limits envd
// keeps. With openat2 (RESOLVE_NO_MAGICLINKS) the kernel refuses such a path
// with ELOOP; a kernel without it (ENOSYS, before Linux 5.6) has the path
// refused here when it names or leads into /proc or /dev/fd, or is a link
// that does not resolve: stricter than openat2 (no /proc/meminfo), and
// checked before the open, which a process of the sandbox could race.
func openFile(p string, flag int, perm fs.FileMode) (*os.File, error) {
	how := &unix.OpenHow{Flags: uint64(flag) | unix.O_CLOEXEC, Mode: uint64(perm.Perm()), Resolve: unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(unix.AT_FDCWD, p, how)
	for errors.Is(err, unix.EINTR) { // as os.OpenFile retries (a FIFO, FUSE)
		fd, err = unix.Openat2(unix.AT_FDCWD, p, how)
	}
	switch {
	case err == nil:
		return os.NewFile(uintptr(fd), p), nil
	case errors.Is(err, unix.ENOSYS):
		if reachesProcess(p) {
			return nil, &fs.PathError{Op: "open", Path: p, Err: errProcessFiles}
		}
		return os.OpenFile(p, flag, perm)
	case errors.Is(err, unix.ELOOP):
		return nil, &fs.PathError{Op: "open", Path: p, Err: errProcessFiles}
	}
	return nil, &fs.PathError{Op: "open", Path: p, Err: err}
}

// errProcessFiles is the refusal of a path through a magic link. It is an
// ELOOP (a 400), which openat2 also answers for a loop of symlinks.
var errProcessFiles = fmt.Errorf("%w: a loop of symlinks, or a link into a process's descriptors (/proc/<pid>/fd, /dev/stdout), which file requests do not follow", syscall.ELOOP)

// reachesProcess says whether p, or where its links lead, is in /proc or
// /dev/fd (or /dev/stdin, stdout, stderr), or is a link that does not
// resolve, as a magic link does not from the sandbox's root.
func reachesProcess(p string) bool {
	in := func(p string) bool {
		p = filepath.Clean(p)
		for _, dir := range []string{"/proc", "/dev/fd"} {
			if p == dir || strings.HasPrefix(p, dir+"/") {
				return true
			}
		}
		return p == "/dev/stdin" || p == "/dev/stdout" || p == "/dev/stderr"
	}
	if in(p) {
		return true
	}
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		fi, lerr := os.Lstat(p)
		return lerr == nil && fi.Mode()&fs.ModeSymlink != 0
	}
	return in(resolved)
}
