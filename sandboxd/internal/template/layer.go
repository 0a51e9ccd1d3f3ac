// Package template turns images into template root filesystems: an OCI
// image archive (an OCI layout tarball, or what `docker save` writes) is
// unpacked layer by layer into a directory, honouring whiteouts.
//
// Every write goes through an os.Root, so no archive entry, symlink or hard
// link can reach outside the destination: an entry that tries fails the
// unpack. Device nodes are skipped (a sandbox gets its devices from its
// runtime).
package template

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// applyLayer applies one uncompressed layer tar on top of what root holds.
func applyLayer(root *os.Root, r io.Reader) error {
	tr := tar.NewReader(r)
	asRoot := os.Geteuid() == 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "" {
			continue // the layer's root directory
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		switch {
		case base == opaqueWhiteout:
			if err := clearDir(root, dir); err != nil {
				return err
			}
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			if err := root.RemoveAll(path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))); err != nil {
				return fmt.Errorf("whiteout %s: %w", name, err)
			}
			continue
		}
		if dir != "" {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", dir, err)
			}
		}
		mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
				if err := root.Remove(name); err != nil {
					return fmt.Errorf("replace %s: %w", name, err)
				}
			}
			if err := root.MkdirAll(name, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
		case tar.TypeReg:
			if err := replace(root, name); err != nil {
				return err
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("write %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := replace(root, name); err != nil {
				return err
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("symlink %s: %w", name, err)
			}
		case tar.TypeLink:
			target, err := cleanName(hdr.Linkname)
			if err != nil || target == "" {
				return fmt.Errorf("hard link %s to %q: outside the image", name, hdr.Linkname)
			}
			if err := replace(root, name); err != nil {
				return err
			}
			if err := root.Link(target, name); err != nil {
				return fmt.Errorf("hard link %s: %w", name, err)
			}
			continue // a link shares its target's owner, mode and times
		default:
			continue // devices and fifos: the runtime provides what a sandbox needs
		}
		if asRoot {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fmt.Errorf("chown %s: %w", name, err)
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			continue
		}
		if err := root.Chmod(name, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", name, err)
		}
		if err := root.Chtimes(name, time.Time{}, hdr.ModTime); err != nil {
			return fmt.Errorf("set times of %s: %w", name, err)
		}
	}
}

// cleanName turns an archive path into one relative to the image root, or
// fails for a path that climbs out of it.
func cleanName(name string) (string, error) {
	p := path.Clean("/" + name)
	if strings.Contains(name, "\x00") {
		return "", fmt.Errorf("archive entry %q: NUL in the name", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("archive entry %q climbs out of the image", name)
		}
	}
	return strings.TrimPrefix(p, "/"), nil
}

// replace removes whatever is at name (an entry of a lower layer), unless
// it is a directory the new entry must not replace.
func replace(root *os.Root, name string) error {
	if _, err := root.Lstat(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", name, err)
	}
	if err := root.RemoveAll(name); err != nil {
		return fmt.Errorf("replace %s: %w", name, err)
	}
	return nil
}

// clearDir removes every entry of dir (an opaque whiteout). The OCI spec
// has the marker come before its siblings in a layer, so what it removes is
// what lower layers made.
func clearDir(root *os.Root, dir string) error {
	if dir == "" {
		dir = "."
	}
	f, err := root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, n := range names {
		if err := root.RemoveAll(path.Join(dir, n)); err != nil {
			return fmt.Errorf("opaque whiteout in %s: %w", dir, err)
		}
	}
	return nil
}
