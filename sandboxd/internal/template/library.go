package template

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// Library holds the templates under a state directory:
//
//	<dir>/<name>/<version>/rootfs   one read-only root filesystem per version
//	<dir>/<name>/current            the version new sandboxes start from
//
// A version is the start of the image's digest (of the archive's image
// config, or of a directory's listing), so importing the same image twice
// changes nothing.
type Library struct {
	dir string
}

// Template is one template in the library.
type Template struct {
	Name     string
	Version  string
	Rootfs   string
	Imported time.Time
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([-_.a-z0-9]{0,61}[a-z0-9])?$`)

// OpenLibrary opens (creating) the library in dir.
func OpenLibrary(dir string) (*Library, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create template library %s: %w", dir, err)
	}
	return &Library{dir: dir}, nil
}

// ImportArchive unpacks an OCI image archive as the current version of
// template name.
func (l *Library) ImportArchive(name, archive string) (*Template, error) {
	return l.importWith(name, func(rootfs string) (string, error) {
		img, err := UnpackArchive(archive, rootfs)
		if err != nil {
			return "", err
		}
		return strings.TrimPrefix(img.Digest, "sha256:"), nil
	})
}

// ImportDir copies a directory tree as the current version of template
// name, keeping modes, owners, times, symlinks and hard links as copies.
func (l *Library) ImportDir(name, src string) (*Template, error) {
	return l.importWith(name, func(rootfs string) (string, error) {
		return copyTree(src, rootfs)
	})
}

// importWith fills a fresh folder through fill (which returns the content's
// digest) and moves it into place as the template's current version.
func (l *Library) importWith(name string, fill func(rootfs string) (string, error)) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("template name %q: want 1 to 63 characters of [a-z0-9-_.], starting and ending with [a-z0-9]", name)
	}
	tdir := filepath.Join(l.dir, name)
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", tdir, err)
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	staging := filepath.Join(tdir, ".import-"+hex.EncodeToString(suffix[:]))
	defer os.RemoveAll(staging)
	digest, err := fill(filepath.Join(staging, "rootfs"))
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	if err := addEnvdTarget(filepath.Join(staging, "rootfs")); err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	version := digest[:min(12, len(digest))]
	final := filepath.Join(tdir, version)
	if _, err := os.Stat(final); err == nil {
		// The same content is already there: keep it.
	} else if err := os.Rename(staging, final); err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	if err := writeFileAtomic(filepath.Join(tdir, "current"), []byte(version+"\n")); err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	return l.Get(name)
}

// addEnvdTarget puts an empty file where every sandbox has envd mounted
// (sandboxrt.EnvdPath) into a template's root, when the image has the
// folder and nothing there yet. Without it each sandbox's init made the
// file in the sandbox's own layer, copying the folders above it up into
// that layer first, and the sandbox's end removed them again: work for
// every sandbox, for a file nobody sees under the mount. The version
// stays the digest of the image as given.
func addEnvdTarget(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	name := strings.TrimPrefix(sandboxrt.EnvdPath, "/")
	if fi, err := root.Lstat(filepath.Dir(name)); err != nil || !fi.IsDir() {
		return nil // no such folder (or a link to one): the init makes them
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("envd's mount point: %w", err)
	}
	return f.Close()
}

// Get returns a template's current version.
func (l *Library) Get(name string) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("template name %q is invalid", name)
	}
	data, err := os.ReadFile(filepath.Join(l.dir, name, "current"))
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	version := strings.TrimSpace(string(data))
	rootfs := filepath.Join(l.dir, name, version, "rootfs")
	fi, err := os.Stat(rootfs)
	if err != nil {
		return nil, fmt.Errorf("template %s version %s: %w", name, version, err)
	}
	return &Template{Name: name, Version: version, Rootfs: rootfs, Imported: fi.ModTime()}, nil
}

// List returns every template's current version, sorted by name.
func (l *Library) List() ([]*Template, error) {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("read template library: %w", err)
	}
	var out []*Template
	for _, e := range entries {
		if !e.IsDir() || !nameRE.MatchString(e.Name()) {
			continue
		}
		t, err := l.Get(e.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue // an import that never finished
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Template) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// copyTree copies src into dest and returns a digest of what it copied
// (paths, types, modes, owners, sizes and link targets; file contents are
// hashed too).
func copyTree(src, dest string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dest, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(h, "%s\x00%v\x00%d\x00", rel, fi.Mode(), fi.Size())
		switch {
		case fi.IsDir():
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00", link)
			return chown(target, st, os.Symlink(link, target))
		case fi.Mode().IsRegular():
			if err := copyFile(p, target, h); err != nil {
				return err
			}
		default:
			return nil // devices, sockets, fifos: the runtime provides them
		}
		if err := chown(target, st, nil); err != nil {
			return err
		}
		if err := os.Chmod(target, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return err
		}
		return os.Chtimes(target, time.Time{}, fi.ModTime())
	})
	if err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// chown gives target the owner of st when running as root, after err (the
// creation's error) is nil.
func chown(target string, st *syscall.Stat_t, err error) error {
	if err != nil || st == nil || os.Geteuid() != 0 {
		return err
	}
	return os.Lchown(target, int(st.Uid), int(st.Gid))
}

func copyFile(src, dst string, h io.Writer) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.MultiWriter(out, h), in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func writeFileAtomic(p string, data []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
