package native

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// idRange is the size of every sandbox's uid and gid range.
const idRange = 65536

// newUserns makes the user namespace of one sandbox: it maps the
// sandbox's 0..65535 to base..base+65535, for uids and gids alike, and it
// is owned by host uid base, the sandbox's root, rather than by host root.
//
// The owner is who the kernel charges the per-user counts of everything
// made inside the namespace (inotify instances and watches, pending
// signals, POSIX message queue bytes, user namespaces): each is counted
// once for the user inside and once more for the namespace's owner, against
// the host's per-user limits (fs.inotify.max_user_instances, …). A
// namespace made by sandboxd itself would be owned by host root, so every
// sandbox would share root's counts, and one sandbox holding 128 inotify
// instances would leave host root and every other sandbox with EMFILE.
// Owned by its own host uid, each sandbox has the host's per-user limits to
// itself, and host root's counts are untouched.
//
// The namespace is made by a helper that runs as uid base: this binary
// again, whose C constructor (userns_owner.c) unshares a user namespace
// before the Go runtime starts, says so, and waits; sandboxd (root) writes
// the id maps, opens the namespace, and lets the helper go. The returned
// file holds the namespace; the caller closes it.
func newUserns(base uint32) (_ *os.File, err error) {
	if !hasOwnerHelper {
		return nil, errors.New("user namespace for a sandbox: sandboxd was built without cgo")
	}
	// The helper's Pdeathsig fires when the thread that started it ends,
	// not the process. Unlocked, this goroutine leaves its thread while it
	// waits on the pipe, and a goroutine that locks a thread and exits
	// locked (a namespace switch: native.go, bootid.go, package network)
	// may take it and end it, killing the helper before it says anything.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	stdin, release, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer stdin.Close()
	defer release.Close()
	status, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer status.Close()
	proc, err := os.StartProcess("/proc/self/exe", []string{"skiff-userns-owner"}, &os.ProcAttr{
		Env:   []string{ownerEnv + "=1"},
		Files: []*os.File{stdin, statusW, nil},
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: base, Gid: base},
			Pdeathsig:  syscall.SIGKILL,
		},
	})
	_ = statusW.Close()
	if err != nil {
		return nil, fmt.Errorf("start the owner of a user namespace for uid %d: %w", base, err)
	}
	defer func() {
		if err != nil {
			_ = proc.Kill()
		}
		_ = release.Close() // lets the helper go
		_, _ = proc.Wait()
	}()
	line, err := bufio.NewReader(status).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("user namespace for uid %d: its owner said nothing: %w", base, err)
	}
	if line = strings.TrimSpace(line); line != "ok" {
		errno, _ := strconv.Atoi(line)
		return nil, fmt.Errorf("user namespace for uid %d: unshare: %w", base, syscall.Errno(errno))
	}
	pid := "/proc/" + strconv.Itoa(proc.Pid)
	m := fmt.Sprintf("0 %d %d\n", base, idRange)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(pid+"/"+f, []byte(m), 0); err != nil {
			return nil, fmt.Errorf("user namespace for uid %d: write %s: %w", base, f, err)
		}
	}
	ns, err := os.Open(pid + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("open user namespace for uid %d: %w", base, err)
	}
	return ns, nil
}

// ownerEnv tells this binary, started again, to be a user namespace's
// owner (userns_owner.c).
const ownerEnv = "_SKIFF_USERNS_OWNER"

// nsPath is a path to the namespace f holds that another process of the
// host (libcontainer's init, a child of this one) can open.
func nsPath(f *os.File) string {
	return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(int(f.Fd()))
}

// idmappedTree returns a detached, read-only copy of the tree at path whose
// files appear owned by their uid and gid plus base: what the template's
// root-owned files must look like to a user namespace mapped at base. The
// caller closes the file; the mount lives while something (an overlay)
// references it.
func idmappedTree(path string, userns *os.File) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, fmt.Errorf("open_tree %s: %w", path, err)
	}
	tree := os.NewFile(uintptr(fd), path)
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		_ = tree.Close()
		if errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("idmap %s (the filesystem must support idmapped mounts): %w", path, err)
		}
		return nil, fmt.Errorf("idmap %s: %w", path, err)
	}
	return tree, nil
}
