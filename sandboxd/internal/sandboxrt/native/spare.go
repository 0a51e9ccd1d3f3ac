package native

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// Spare disks: the disk of a sandbox that ends is emptied and kept, still
// attached and mounted, for the next sandbox of the same size, instead of
// being unmounted, detached and deleted while the next one's is copied,
// attached and mounted. That was about 5 ms of the host's CPU a lifecycle
// and a fifth of the lifecycles a second at c = 20: the loop devices' and
// mount namespace's locks and RCU waits serialise those steps.
//
// A spare is the ended sandbox's directory, renamed into <Dir>/spares: the
// mount moves with its directory. What the next sandbox gets is an ext4
// filesystem holding only lost+found; nothing of the last one's files is
// reachable through it (its root cannot read the device, and ext4 gives a
// new file's blocks back as zeros), and deleted blocks go back to the
// host (discard). A disk whose sandbox made more than spareMaxInodes
// files is not kept, so that emptying it never holds up a kill for long.
// Spares live in memory only: those a crash left are discarded at New,
// and Close discards them.

// spareMaxInodes is the most inodes a disk may use to be kept as a spare.
const spareMaxInodes = 4096

// keepDisk empties the disk of stopped sandbox id and keeps its directory
// as a spare; it reports whether the directory left the sandboxes' (kept,
// or discarded when others filled the spares meanwhile). One it leaves
// there, perhaps emptied, is for Stop to unmount and delete.
func (r *Runtime) keepDisk(id string) bool {
	if r.opts.SpareDisks <= 0 {
		return false
	}
	m, err := r.readMeta(id)
	if err != nil || m.DiskLimit == 0 {
		return false
	}
	dir := r.dir(id)
	mnt := filepath.Join(dir, diskMount)
	if !sandboxrt.IsMountPoint(mnt) {
		return false
	}
	r.spareMu.Lock()
	full := len(r.spares[m.DiskLimit]) >= r.opts.SpareDisks
	r.spareMu.Unlock()
	if full {
		return false
	}
	var st unix.Statfs_t
	if unix.Statfs(mnt, &st) != nil || st.Files-st.Ffree > spareMaxInodes {
		return false
	}
	if empty(mnt, "lost+found") != nil || empty(dir, diskMount, diskImage) != nil {
		return false
	}
	spare := filepath.Join(r.spareDir, strconv.FormatUint(r.spareSeq.Add(1), 10))
	if err := os.Rename(dir, spare); err != nil {
		return false
	}
	r.spareMu.Lock()
	defer r.spareMu.Unlock()
	if len(r.spares[m.DiskLimit]) >= r.opts.SpareDisks {
		// Others were kept meanwhile.
		if err := discardSpare(spare); err != nil {
			r.opts.Logger.Warn("discard a spare disk", "path", spare, "error", err)
		}
		return true
	}
	r.spares[m.DiskLimit] = append(r.spares[m.DiskLimit], spare)
	return true
}

// takeDisk makes a spare disk of limit bytes sandbox id's directory, with
// its disk mounted; it reports whether there was one.
func (r *Runtime) takeDisk(id string, limit int64) bool {
	for {
		r.spareMu.Lock()
		list := r.spares[limit]
		if len(list) == 0 {
			r.spareMu.Unlock()
			return false
		}
		spare := list[len(list)-1]
		r.spares[limit] = list[:len(list)-1]
		r.spareMu.Unlock()
		if sandboxrt.IsMountPoint(filepath.Join(spare, diskMount)) && os.Rename(spare, r.dir(id)) == nil {
			return true
		}
		if err := discardSpare(spare); err != nil {
			r.opts.Logger.Warn("discard a spare disk", "path", spare, "error", err)
		}
	}
}

// discardSpares unmounts and deletes every spare disk in r.spareDir.
func (r *Runtime) discardSpares() error {
	r.spareMu.Lock()
	r.spares = map[int64][]string{}
	r.spareMu.Unlock()
	return DiscardSpares(r.spareDir)
}

// SparesDir is where the native runtime of directory dir (Options.Dir)
// keeps its spare disks.
func SparesDir(dir string) string { return filepath.Join(dir, "spares") }

// DiscardSpares unmounts and deletes the spare disks in dir (SparesDir),
// as a crashed sandboxd left them.
func DiscardSpares(dir string) error {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("spare disks: %w", err)
	}
	for _, e := range entries {
		if err := discardSpare(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func discardSpare(path string) error {
	if err := detachDisk(path); err != nil {
		return fmt.Errorf("spare disk %s: %w", path, err)
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("spare disk %s: %w", path, err)
	}
	return nil
}

// empty removes everything in dir but the entries named keep.
func empty(dir string, keep ...string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if slices.Contains(keep, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
