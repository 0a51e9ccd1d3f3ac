package native

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// A sandbox's writable layer (its overlay's upper and work directories)
// lives on a filesystem of its own, the size of the sandbox's disk: an
// image of package diskimage under the sandbox's directory. Before, the
// upper layer sat on the state directory's filesystem: a sandbox could fill
// the host's disk, and measuring it walked every file (30 % of a core for
// 300k files). A sandbox with no disk size (0) keeps its layer on the
// state directory, unlimited, as before.

const (
	// diskMount is where a sandbox's filesystem is mounted in its directory;
	// diskImage its image file.
	diskMount = "disk"
	diskImage = "disk.img"
)

// diskFormat: an ext4 without a journal (a host crash ends a native
// sandbox anyway), without blocks reserved for root (the sandbox's root is
// its only user), without the group descriptors reserved for growing it
// online (resize_inode: nothing resizes a sandbox's disk, and at 10 GiB
// they were 4.1 of the image's 4.3 MiB, copied for every sandbox; now 228
// KiB), whose inode tables are left for the kernel to set up lazily;
// mounted with discard, which gives deleted blocks back to the host, and
// noinit_itable, which keeps the kernel from zeroing every inode table in
// the background.
var diskFormat = diskimage.Format{
	Name:      "v2",
	MkfsArgs:  []string{"-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"},
	MountData: "discard,noinit_itable",
}

// CheckDisks reports what stops this host from giving sandboxes disks of
// their own: loop devices and mkfs.ext4. sandboxd checks it at start when
// sandboxes get disks, rather than fail every create.
func CheckDisks() error {
	if err := diskimage.Check("sandboxes' disks"); err != nil {
		return fmt.Errorf("%w; or give --default-disk 0 to keep their writable layers on the state directory, unlimited", err)
	}
	return nil
}

// attachDisk gives the sandbox in dir its filesystem of mib MiB, mounted
// at dir/disk, and returns the mount point.
func (r *Runtime) attachDisk(dir string, mib int64) (string, error) {
	image, mnt := filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)
	if err := r.golden.Make(image, mib); err != nil {
		return "", err
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", err
	}
	if err := diskimage.Mount(image, mnt, diskFormat.MountData); err != nil {
		return "", err
	}
	return mnt, nil
}

// detachDisk unmounts the sandbox's filesystem, if it has one; its loop
// device goes once nothing holds the filesystem.
func detachDisk(dir string) error {
	if err := sandboxrt.Unmount(filepath.Join(dir, diskMount)); err != nil {
		return fmt.Errorf("unmount disk: %w", err)
	}
	return nil
}

// diskUsed is the space used on the sandbox's filesystem, as df says it;
// -1 when it has none.
func diskUsed(dir string) int64 { return diskimage.Used(filepath.Join(dir, diskMount)) }
