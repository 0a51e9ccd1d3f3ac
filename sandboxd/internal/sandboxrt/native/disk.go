package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// A sandbox's writable layer (its overlay's upper and work directories)
// lives on a filesystem of its own, the size of the sandbox's disk: a
// sparse ext4 image under the sandbox's directory, mounted through a loop
// device. Writes past the size fail with ENOSPC inside the sandbox, the
// host's disk gets only what the sandbox wrote (deletions punch holes back,
// through discard), and the space used is one statfs away: nothing walks
// the sandbox's files. Before, the upper layer sat on the state
// directory's filesystem: a sandbox could fill the host's disk, and
// measuring it walked every file (30 % of a core for 300k files).
//
// The other way, project quotas on the state directory's filesystem, needs
// a kernel with CONFIG_QUOTA (ext4) or CONFIG_XFS_QUOTA and a filesystem
// formatted and mounted for it; the build machines' kernel has neither, and
// an image works on any host with loop devices.
//
// An image starts as a copy of a golden image of its size, made once per
// size with mkfs.ext4 (about 0.1 s for 10 GiB here), copied sparsely (its
// 4 MiB of metadata: a few ms), attached with LOOP_CONFIGURE and mounted.
// The loop device detaches itself when the filesystem is last unmounted
// (LO_FLAGS_AUTOCLEAR). A sandbox with no disk size (0) keeps its layer on
// the state directory, unlimited, as before.

const (
	// diskMount is where a sandbox's filesystem is mounted in its directory;
	// diskImage its image file.
	diskMount = "disk"
	diskImage = "disk.img"
	// minDiskMiB is the smallest image made: ext4 needs room for itself.
	minDiskMiB = 32
	// goldenVersion names the mkfs options below; a change gets new golden
	// images rather than reusing old ones.
	goldenVersion = "v1"
)

// mkfsArgs make an ext4 without a journal (a host crash ends a native
// sandbox anyway), without blocks reserved for root (the sandbox's root is
// its only user), whose inode tables are left for the kernel to set up
// lazily.
var mkfsArgs = []string{"-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}

// mountData: discard gives deleted blocks back to the host; noinit_itable
// keeps the kernel from zeroing every inode table in the background.
const mountData = "discard,noinit_itable"

// CheckDisks reports what stops this host from giving sandboxes disks of
// their own: loop devices and mkfs.ext4. sandboxd checks it at start when
// sandboxes get disks, rather than fail every create.
func CheckDisks() error {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandboxes' disks are loop-mounted images, and /dev/loop-control cannot be opened (%w): load the loop module (modprobe loop), or give --default-disk 0 to keep their writable layers on the state directory, unlimited", err)
	}
	_ = ctl.Close()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("sandboxes' disks are ext4 images, and mkfs.ext4 is not in PATH (%w): install e2fsprogs, or give --default-disk 0 to keep their writable layers on the state directory, unlimited", err)
	}
	return nil
}

// goldenImages makes and keeps one empty image per size.
type goldenImages struct {
	dir string
	mu  sync.Mutex
}

// get returns the path of the empty image of mib MiB, making it if needed.
func (g *goldenImages) get(mib int64) (string, error) {
	path := filepath.Join(g.dir, fmt.Sprintf("ext4-%s-%dm.img", goldenVersion, mib))
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(g.dir, 0o700); err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	err = f.Truncate(mib << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var out []byte
		if out, err = exec.Command("mkfs.ext4", append(mkfsArgs, tmp)...).CombinedOutput(); err != nil {
			err = fmt.Errorf("mkfs.ext4 (e2fsprogs): %w: %s", err, out)
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("make an empty disk image of %d MiB: %w", mib, err)
	}
	return path, nil
}

// attachDisk gives the sandbox in dir its filesystem of mib MiB, mounted
// at dir/disk, and returns the mount point.
func (r *Runtime) attachDisk(dir string, mib int64) (string, error) {
	golden, err := r.golden.get(max(mib, minDiskMiB))
	if err != nil {
		return "", err
	}
	image, mnt := filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)
	if err := layer.CopySparse(golden, image); err != nil {
		return "", fmt.Errorf("copy the disk image: %w", err)
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", err
	}
	if err := mountLoop(image, mnt); err != nil {
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
func diskUsed(dir string) int64 {
	var st unix.Statfs_t
	mnt := filepath.Join(dir, diskMount)
	if err := unix.Statfs(mnt, &st); err != nil || !sandboxrt.IsMountPoint(mnt) {
		return -1
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// mountLoop attaches image to a free loop device and mounts its ext4 at
// mnt. The device is configured to detach itself when the filesystem is
// last released.
func mountLoop(image, mnt string) error {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	backing, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer backing.Close()
	// Another process may take the free device between the two calls.
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		err = configureAndMount(dev, backing, mnt)
		if errors.Is(err, unix.EBUSY) && attempt < 100 {
			continue
		}
		return err
	}
}

func configureAndMount(dev string, backing *os.File, mnt string) error {
	loop, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	// The device must stay open until mounted: with autoclear, its last
	// close before that would detach it.
	defer loop.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	// Direct I/O keeps the image's pages out of the host's page cache,
	// where they would sit a second time beside the filesystem's own.
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
	err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
	if errors.Is(err, unix.EINVAL) {
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
	}
	if err != nil {
		return fmt.Errorf("configure %s: %w", dev, err)
	}
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID, mountData); err != nil {
		_ = unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	return nil
}
