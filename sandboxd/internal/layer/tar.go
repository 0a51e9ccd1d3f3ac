package layer

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// WriteTar writes the layer (or any directory the store keeps) in dir as a
// tar, the form in which hosts send it to one another and take its digest
// (Digest): the same tree always gives the same bytes. Entries come in
// lexical order, each with its type, mode, numeric owner, modification
// time (to the nanosecond, in PAX records), link target or device, and the
// extended attributes a layer keeps; never an access time, a change time or
// an owner's name, which differ between two copies of one tree. A file
// with several names is written once, its other names as hard links to
// the first. Sockets are left out, as a layer never keeps them.
func WriteTar(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[fileKey]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		return writeEntry(tw, path, rel, links)
	})
	if err != nil {
		return fmt.Errorf("tar of %s: %w", dir, err)
	}
	return tw.Close()
}

func writeEntry(tw *tar.Writer, path, rel string, links map[fileKey]string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	name := "./" + filepath.ToSlash(rel)
	if rel == "." {
		name = "./"
	}
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
		Format:  tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		if rel != "." {
			hdr.Name += "/"
		}
	case unix.S_IFREG:
		key := fileKey{uint64(st.Dev), st.Ino} //nolint:unconvert // Dev is not uint64 on every arch
		if first, ok := links[key]; ok && st.Nlink > 1 {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return tw.WriteHeader(hdr)
		}
		if st.Nlink > 1 {
			links[key] = name
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	case unix.S_IFLNK:
		target, err := os.Readlink(path)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		hdr.Typeflag = map[uint32]byte{unix.S_IFCHR: tar.TypeChar, unix.S_IFBLK: tar.TypeBlock, unix.S_IFIFO: tar.TypeFifo}[st.Mode&unix.S_IFMT]
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev))) //nolint:unconvert // Rdev is not uint64 on every arch
	default:
		return nil
	}
	xattrs, err := keptXattrs(path)
	if err != nil {
		return err
	}
	for _, x := range xattrs {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+x.name] = string(x.value)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if n, err := io.Copy(tw, f); err != nil {
		return err
	} else if n != hdr.Size {
		return fmt.Errorf("%s changed while it was read", path)
	}
	return nil
}

// Digest is the SHA-256 of WriteTar of dir, as "sha256:<hex>".
func Digest(dir string) (string, error) {
	h := sha256.New()
	if err := WriteTar(dir, h); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// ErrDigest is a tar whose bytes are not those its digest names.
var ErrDigest = errors.New("digest mismatch")

// FromVerifiedTar unpacks r (WriteTar's form) into dst, which must not
// exist, as FromTar does, and checks that r's bytes, up to its end, have
// digest want ("sha256:<hex>"). On a mismatch or any error dst is removed.
func FromVerifiedTar(r io.Reader, dst, want string) error {
	h := sha256.New()
	tee := io.TeeReader(r, h)
	err := FromTar(tee, dst)
	if err == nil {
		// The tar's end: the zero blocks after its last entry.
		_, err = io.Copy(io.Discard, tee)
	}
	if err == nil {
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want {
			err = fmt.Errorf("%w: got %s, want %s", ErrDigest, got, want)
		}
	}
	if err != nil {
		_ = Remove(dst)
		return err
	}
	return nil
}
