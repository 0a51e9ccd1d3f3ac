package native

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// idRange is the size of every sandbox's uid and gid range.
const idRange = 65536

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
