package native

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// bootIDPath is where Linux tells a boot apart from the others, and where
// a sandbox finds its own: a file of its directory, bind-mounted over the
// kernel's. libcontainer refuses mounts under /proc/sys, so sandboxd makes
// this one itself, from the host, once the sandbox's mount namespace is
// set up and before envd runs. Each start of a sandbox (a create, a boot
// after a files-only pause) has a new one; a freeze keeps it.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// mountBootID gives the sandbox whose init is pid a boot ID of its own. The
// file is in dir: the sandbox's disk, if it has one, beside (not in) its
// writable layer, as envd's log is, so that it goes with the disk.
func mountBootID(dir string, pid int) error {
	file := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(file, []byte(newBootID()+"\n"), 0o444); err != nil {
		return fmt.Errorf("boot ID: %w", err)
	}
	// A detached bind mount of the file, made read-only, then attached
	// in the sandbox's mount namespace, where the sandbox's root (whose
	// capabilities are its user namespace's) cannot unmount it.
	tree, err := unix.OpenTree(unix.AT_FDCWD, file, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("boot ID: open_tree: %w", err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("boot ID: mount_setattr: %w", err)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fmt.Errorf("boot ID: %w", err)
	}
	defer ns.Close()
	// The throwaway thread joins the sandbox's mount namespace and ends
	// there.
	_, err = onThrowawayThread(func() (struct{}, error) {
		if err := enterMountNS(ns); err != nil {
			return struct{}{}, fmt.Errorf("enter the sandbox's mount namespace: %w", err)
		}
		if err := unix.MoveMount(tree, "", unix.AT_FDCWD, bootIDPath, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return struct{}{}, fmt.Errorf("move_mount to %s: %w", bootIDPath, err)
		}
		return struct{}{}, nil
	})
	if err != nil {
		return fmt.Errorf("boot ID: %w", err)
	}
	return nil
}

// newBootID is a random (version 4) UUID, as the kernel makes its own.
func newBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
