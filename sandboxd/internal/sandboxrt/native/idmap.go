package native

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// idRange is the size of every sandbox's uid and gid range.
const idRange = 65536

// usernsCache holds one user namespace file per uid base, to idmap template
// mounts with. Creating one costs a fork; a base is reused by every sandbox
// that gets its slot, so each is made once per sandboxd process.
type usernsCache struct {
	mu  sync.Mutex
	fds map[uint32]*os.File
}

// get returns a user namespace mapping 0..65535 to base..base+65535, for
// uids and gids alike. The file stays owned by the cache.
func (c *usernsCache) get(base uint32) (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.fds[base]; ok {
		return f, nil
	}
	f, err := newUserns(base)
	if err != nil {
		return nil, err
	}
	if c.fds == nil {
		c.fds = map[uint32]*os.File{}
	}
	c.fds[base] = f
	return f, nil
}

func (c *usernsCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.fds {
		_ = f.Close()
	}
	c.fds = nil
}

// newUserns makes a user namespace with the mapping by starting a process in
// it that stops, traced, before it executes anything (the technique runc
// uses for idmapped mounts), opening its namespace, and killing it.
func newUserns(base uint32) (*os.File, error) {
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: idRange}}
	proc, err := os.StartProcess("/proc/self/exe", []string{"skiff-userns"}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER,
			UidMappings: m,
			GidMappings: m,
			Ptrace:      true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("start a process in a user namespace for uid %d: %w", base, err)
	}
	defer func() {
		_ = proc.Kill()
		_, _ = proc.Wait()
	}()
	f, err := os.Open("/proc/" + strconv.Itoa(proc.Pid) + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("open user namespace for uid %d: %w", base, err)
	}
	return f, nil
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
