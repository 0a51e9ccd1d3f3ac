// Package layer makes the filesystem layers snapshots are made of: a
// directory tree in overlayfs's format (a deleted file is a 0/0 character
// device, a directory that hides the one below has the xattr
// trusted.overlay.opaque=y), owned as inside the sandbox (uid 0 is the
// sandbox's root), so that any runtime can stack it between a template and a
// new sandbox's private upper layer, idmapped into that sandbox's uids.
//
// A layer is written into a directory of its own, which the caller renames
// into place once the layer is whole (Sync first): a crash leaves a
// half-written layer only under its temporary name.
package layer

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// IDRange is the number of uids (and gids) a sandbox has: owners inside a
// layer are below it.
const IDRange = 65536

// overflowID is the owner given to a file whose owner is outside the
// sandbox's range (it cannot be one of the sandbox's own): nobody.
const overflowID = 65534

// opaqueXattr marks an overlay directory that hides the ones below it.
const opaqueXattr = "trusted.overlay.opaque"

// keptXattr reports whether an extended attribute is copied into a layer:
// the overlay's opaque mark and the sandbox's own user.* attributes.
// Others (security.capability, whose v3 form names the host uid of the
// sandbox's root; trusted.overlay.origin, a handle of the lower file) would
// mean something else, or nothing, under another sandbox.
func keptXattr(name string) bool {
	return name == opaqueXattr || strings.HasPrefix(name, "user.")
}

// CopyUpper copies the overlay upper directory src into dst, which must not
// exist, subtracting base from every owner (a native sandbox's files are
// owned by host uids base + n). The caller keeps src from changing (the
// sandbox frozen).
func CopyUpper(src, dst string, base int64) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	c := &copier{base: base, links: map[fileKey]string{}}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		return c.copy(path, filepath.Join(dst, rel), rel == ".")
	})
	if err != nil {
		return fmt.Errorf("copy upper layer %s: %w", src, err)
	}
	return c.finish()
}

type fileKey struct{ dev, ino uint64 }

type copier struct {
	base  int64
	links map[fileKey]string // first copy of each file with more than one link
	dirs  []dirTimes         // set once their entries are written
}

type dirTimes struct {
	path string
	st   unix.Stat_t
}

// owner maps a host owner into the sandbox's range.
func (c *copier) owner(id uint32) int {
	n := int64(id) - c.base
	if n < 0 || n >= IDRange {
		return overflowID
	}
	return int(n)
}

func (c *copier) copy(src, dst string, root bool) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	mode := st.Mode & unix.S_IFMT
	if mode == unix.S_IFREG && st.Nlink > 1 {
		key := fileKey{uint64(st.Dev), st.Ino} //nolint:unconvert // Dev is not uint64 on every arch
		if first, ok := c.links[key]; ok {
			return os.Link(first, dst)
		}
		c.links[key] = dst
	}
	switch mode {
	case unix.S_IFDIR:
		if !root {
			if err := os.Mkdir(dst, 0o700); err != nil {
				return err
			}
		}
		c.dirs = append(c.dirs, dirTimes{dst, st})
	case unix.S_IFREG:
		if err := CopySparse(src, dst); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	default: // sockets: nothing to keep
		return nil
	}
	if err := unix.Lchown(dst, c.owner(st.Uid), c.owner(st.Gid)); err != nil {
		return err
	}
	if mode != unix.S_IFLNK {
		// After the chown, which clears set-id bits.
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if mode != unix.S_IFDIR {
		return setTimes(dst, &st)
	}
	return nil
}

// finish gives the directories their times, deepest first (writing into a
// directory changes its mtime).
func (c *copier) finish() error {
	for _, d := range slices.Backward(c.dirs) {
		if err := setTimes(d.path, &d.st); err != nil {
			return err
		}
	}
	return nil
}

func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// CopySparse copies src to a new file dst, only its data: the holes stay
// holes (a sandbox's sparse file costs the host no more than it holds).
func CopySparse(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	size := st.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

func copyXattrs(src, dst string) error {
	xattrs, err := keptXattrs(src)
	if err != nil {
		return err
	}
	for _, x := range xattrs {
		if err := unix.Lsetxattr(dst, x.name, x.value, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", x.name, dst, err)
		}
	}
	return nil
}

type xattr struct {
	name  string
	value []byte
}

// keptXattrs are the extended attributes of path a layer keeps
// (keptXattr), in the order the filesystem lists them.
func keptXattrs(path string) ([]xattr, error) {
	names, err := listXattrs(path)
	if err != nil {
		return nil, err
	}
	var out []xattr
	for _, name := range names {
		if !keptXattr(name) {
			continue
		}
		v, err := getXattr(path, name)
		if err != nil {
			return nil, err
		}
		out = append(out, xattr{name, v})
	}
	return out, nil
}

func listXattrs(path string) ([]string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
		}
		return buf[:n], nil
	}
}

// FromTar unpacks a tar of an overlay upper layer (runsc tar rootfs-upper)
// into dst, which must not exist. Owners are taken as they are: inside the
// sandbox's range. Entries that would leave dst (absolute paths, "..") are
// refused.
func FromTar(r io.Reader, dst string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var dirs []*tar.Header
	// The symlinks unpacked so far: an entry beneath one is refused, so
	// that every directory a path below goes through is a real one made
	// here, and the calls that take host paths (mknod, chown, xattrs)
	// cannot be led outside dst by the sandbox's own symlinks.
	links := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer tar: %w", err)
		}
		name := filepath.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("layer tar entry %q leaves the layer", hdr.Name)
		}
		for dir := filepath.Dir(name); dir != "." && dir != "/"; dir = filepath.Dir(dir) {
			if links[dir] {
				return fmt.Errorf("layer tar entry %q is beneath the symlink %q", hdr.Name, dir)
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			links[name] = true
		}
		path := filepath.Join(dst, name)
		if err := untarEntry(root, tr, hdr, name, path); err != nil {
			return fmt.Errorf("layer tar entry %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeLink {
			// A second name of a symlink is a symlink: nothing goes
			// beneath it either.
			if fi, err := root.Lstat(name); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
				links[name] = true
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			h := *hdr
			h.Name = path
			dirs = append(dirs, &h)
		}
	}
	for _, h := range slices.Backward(dirs) {
		if err := setHeaderTimes(h.Name, h); err != nil {
			return err
		}
	}
	return nil
}

func untarEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name, path string) error {
	if name != "." {
		// The entry's directory, inside the root (a symlink in the tar
		// cannot lead outside it).
		if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
	}
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name != "." {
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
	case tar.TypeLink:
		target := filepath.Clean(strings.TrimPrefix(hdr.Linkname, "/"))
		if err := root.Link(target, name); err != nil {
			return err
		}
		return nil // the first name has the owner, mode and times
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// A layer holds no device but overlayfs's whiteout (a 0/0
		// character device): a sandbox cannot make another, and one in a
		// layer would be a way to the host's devices.
		if hdr.Typeflag != tar.TypeFifo && (hdr.Typeflag != tar.TypeChar || hdr.Devmajor != 0 || hdr.Devminor != 0) {
			return fmt.Errorf("a device node (%d:%d) other than a whiteout", hdr.Devmajor, hdr.Devminor)
		}
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if err := unix.Mknod(path, kind|mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			return err
		}
	default:
		return nil
	}
	// What the calls below change by its host path must be the entry
	// itself: a directory entry over a symlink an earlier entry made (or
	// a second name of one) would have them follow it out of the layer,
	// a chmod of a host file as root.
	fi, err := root.Lstat(name)
	if err != nil {
		return err
	}
	if want := map[byte]fs.FileMode{tar.TypeDir: fs.ModeDir, tar.TypeReg: 0, tar.TypeSymlink: fs.ModeSymlink,
		tar.TypeChar: fs.ModeDevice | fs.ModeCharDevice, tar.TypeFifo: fs.ModeNamedPipe}[hdr.Typeflag]; fi.Mode().Type() != want {
		return fmt.Errorf("it names an entry of another type (%s) made before it", fi.Mode().Type())
	}
	uid, gid := hdr.Uid, hdr.Gid
	if uid < 0 || uid >= IDRange {
		uid = overflowID
	}
	if gid < 0 || gid >= IDRange {
		gid = overflowID
	}
	if err := unix.Lchown(path, uid, gid); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Chmod(path, mode); err != nil {
			return err
		}
	}
	for key, val := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(key, "SCHILY.xattr."); ok && keptXattr(name) {
			if err := unix.Lsetxattr(path, name, []byte(val), 0); err != nil {
				return fmt.Errorf("set xattr %s: %w", name, err)
			}
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		return setHeaderTimes(path, hdr)
	}
	return nil
}

func setHeaderTimes(path string, hdr *tar.Header) error {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// Sync makes everything written under dir durable: one syncfs of its
// filesystem, cheaper than an fsync per file.
func Sync(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// Size is the bytes a layer's files hold (allocated blocks), counting each
// file once.
func Size(dir string) (int64, error) {
	var total int64
	seen := map[fileKey]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		key := fileKey{uint64(st.Dev), st.Ino} //nolint:unconvert // Dev is not uint64 on every arch
		if !seen[key] {
			seen[key] = true
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// Remove deletes a layer directory.
func Remove(dir string) error {
	return os.RemoveAll(dir)
}
