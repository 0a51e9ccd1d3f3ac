// Package diskimage makes filesystems of a fixed size out of sparse ext4
// image files mounted through loop devices: a sandbox's disk (package
// native) and a volume (package volume). Writes past the size fail with
// ENOSPC, the host's disk gets only what was written (deletions punch holes
// back, through discard), and the space used is one statfs away: nothing
// walks the files.
//
// The other way, project quotas, needs a kernel with CONFIG_QUOTA (ext4) or
// CONFIG_XFS_QUOTA and a filesystem formatted and mounted for it; the build
// machines' kernel has neither, and an image works on any host with loop
// devices.
//
// An image starts as a copy of a golden image of its size and format, made
// once per size with mkfs.ext4 (about 0.1 s for 10 GiB here), copied
// sparsely (its metadata: from a few hundred KiB to a few MiB, with the
// format), attached with LOOP_CONFIGURE and mounted. The loop device detaches itself when the
// filesystem is last unmounted (LO_FLAGS_AUTOCLEAR).
package diskimage

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// MinMiB is the smallest image made: ext4 needs room for itself.
const MinMiB = 32

// Check reports what stops this host from making images: loop devices and
// mkfs.ext4. what names what the images are for, in the message.
func Check(what string) error {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s are loop-mounted images, and /dev/loop-control cannot be opened (%w): load the loop module (modprobe loop)", what, err)
	}
	_ = ctl.Close()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("%s are ext4 images, and mkfs.ext4 is not in PATH (%w): install e2fsprogs", what, err)
	}
	return nil
}

// Format is a kind of image: its mkfs.ext4 arguments and mount options.
type Format struct {
	// Name names the golden images of this format; a change of MkfsArgs
	// needs a new one, so that old golden images are not reused.
	Name      string
	MkfsArgs  []string
	MountData string
}

// Golden makes and keeps one empty image per size in Dir.
type Golden struct {
	Dir    string
	Format Format
	mu     sync.Mutex
}

// Get returns the path of the empty image of mib MiB (at least MinMiB),
// making it if needed.
func (g *Golden) Get(mib int64) (string, error) {
	mib = max(mib, MinMiB)
	path := filepath.Join(g.Dir, fmt.Sprintf("ext4-%s-%dm.img", g.Format.Name, mib))
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(g.Dir, 0o700); err != nil {
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
		if out, err = exec.Command("mkfs.ext4", append(g.Format.MkfsArgs, tmp)...).CombinedOutput(); err != nil {
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

// Make copies the empty image of mib MiB to image (sparse).
func (g *Golden) Make(image string, mib int64) error {
	golden, err := g.Get(mib)
	if err != nil {
		return err
	}
	if err := layer.CopySparse(golden, image); err != nil {
		return fmt.Errorf("copy the disk image: %w", err)
	}
	return nil
}

// Used is the space used on the filesystem mounted at mnt, as df says it;
// -1 when nothing is mounted there.
func Used(mnt string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil || !sandboxrt.IsMountPoint(mnt) {
		return -1
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// Mount attaches image to a free loop device and mounts its ext4 at mnt
// with data (Format.MountData). The device is configured to detach itself
// when the filesystem is last released.
func Mount(image, mnt, data string) error {
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
		err = configureAndMount(dev, backing, mnt, data)
		if errors.Is(err, unix.EBUSY) && attempt < 100 {
			continue
		}
		return err
	}
}

// MountKept mounts an image that may have been mounted before, as Mount
// does, unless a loop device still serves it: then it mounts that
// device's filesystem again. An unmount in this mount namespace ends the
// filesystem only if no other namespace holds a copy of the mount; a
// namespace made while it was mounted (a sandbox's, until its init
// pivots, on a host whose mounts are private) keeps it alive, its last
// writes not yet in the image. A second filesystem built from the
// image's blocks would miss them, and two would write over each other.
//
// Finding the device reads every loop device's backing file, so images
// made a moment ago, which nothing can serve, use Mount.
func MountKept(image, mnt, data string) error {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return err
	}
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		backing, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		var bst unix.Stat_t
		if unix.Stat(strings.TrimSuffix(string(backing), "\n"), &bst) != nil || bst.Dev != st.Dev || bst.Ino != st.Ino {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		switch err := mountServed(dev, &st, mnt, data); {
		case err == nil:
			return nil
		case !errors.Is(err, errNotServing):
			return err
		}
	}
	return Mount(image, mnt, data)
}

var errNotServing = errors.New("no longer serves the image")

// mountServed mounts the filesystem on dev, a loop device found serving
// the image st, if it still does: opening it keeps it from detaching.
func mountServed(dev string, st *unix.Stat_t, mnt, data string) error {
	loop, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return errNotServing
	}
	defer loop.Close()
	info, err := unix.IoctlLoopGetStatus64(int(loop.Fd()))
	if err != nil || info.Device != st.Dev || info.Inode != st.Ino {
		return errNotServing
	}
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID, data); err != nil {
		return fmt.Errorf("mount %s again: %w", dev, err)
	}
	return nil
}

func configureAndMount(dev string, backing *os.File, mnt, data string) error {
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
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID, data); err != nil {
		_ = unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	return nil
}
