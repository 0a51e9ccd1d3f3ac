package files

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/skiff-dev/skiff/envd/internal/asuser"
	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// Modes of what the routes create; the process umask applies to directories.
const (
	newDirMode  fs.FileMode = 0o755
	newFileMode fs.FileMode = 0o644
)

// destFile is the file an upload or a compose writes. An upload writes in
// place, as e2b's envd does, so a directory watcher sees create and write
// events for the file's own name and never a temporary file. A compose, whose
// destination may be one of its sources, writes a temporary file next to it
// and renames it over the destination on commit.
type destFile struct {
	f       *os.File // nil once closed
	target  string
	tmp     string         // the temporary file a replacement writes; "" in place
	created bool           // in place, the upload made the file: abort removes it
	user    *identity.User // whose identity renames and removes use
}

// How createDest writes.
const (
	inPlace     = false
	replacement = true
)

// createDest opens dest for writing as u. It resolves a symlinked dest to
// the file it points to, creates missing parent directories, and opens the
// file truncated (in place) or a temporary file beside it (replacement),
// with the mode of the file that exists, else newFileMode. Every path is
// resolved and opened with u's identity (asuser.Do), so the kernel allows
// exactly what it would allow u; what it creates is u's, and a file that
// exists keeps its owner and mode.
func createDest(dest string, u *identity.User, replace bool) (*destFile, error) {
	var d *destFile
	err := asuser.Do(u, func() error {
		var err error
		d, err = openDest(dest, replace)
		return err
	})
	if err != nil {
		return nil, err
	}
	d.user = u
	return d, nil
}

// openDest is createDest's work, made with the caller's identity.
func openDest(dest string, replace bool) (*destFile, error) {
	target := dest
	mode := newFileMode
	fi, err := os.Lstat(dest)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if resolved, rerr := filepath.EvalSymlinks(dest); rerr == nil {
			target = resolved
			fi, err = os.Lstat(target)
		}
	}
	switch {
	case err == nil && fi.IsDir():
		return nil, statusf(http.StatusBadRequest, "path '%s' is a directory", dest)
	case err == nil && fi.Mode().IsRegular():
		mode = fi.Mode().Perm()
	case err == nil && fi.Mode()&fs.ModeSymlink == 0:
		return nil, statusf(http.StatusBadRequest, "path '%s' is not a regular file", dest)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fsError(err, "stat "+dest)
	}
	created := err != nil
	dir := filepath.Dir(target)
	if err := mkdirAll(dir); err != nil {
		return nil, fsError(err, "create directory "+dir)
	}
	d := &destFile{target: target}
	if !replace {
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
		if err != nil {
			return nil, fsError(err, "create file "+target)
		}
		d.f, d.created = f, created
		return d, nil
	}
	f, err := os.CreateTemp(dir, ".envd-compose-*")
	if err != nil {
		return nil, fsError(err, "create file in "+dir)
	}
	d.f, d.tmp = f, f.Name()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		os.Remove(d.tmp)
		return nil, fsError(err, "chmod "+d.tmp)
	}
	return d, nil
}

// finish flushes the file to disk and closes it.
func (d *destFile) finish() error {
	f := d.f
	d.f = nil
	if err := f.Sync(); err != nil {
		f.Close()
		return fsError(err, "sync "+d.target)
	}
	if err := f.Close(); err != nil {
		return fsError(err, "close "+d.target)
	}
	return nil
}

// commit keeps a finished file, renaming a replacement over its target;
// after it, abort does nothing.
func (d *destFile) commit() error {
	d.created = false
	if d.tmp == "" {
		return nil
	}
	if err := asuser.Do(d.user, func() error { return os.Rename(d.tmp, d.target) }); err != nil {
		return fsError(err, "rename to "+d.target)
	}
	d.tmp = ""
	return nil
}

// abort closes the file and removes a replacement, or an in-place file the
// upload created, as the user; a file that existed keeps what was written,
// as with e2b's envd.
func (d *destFile) abort() {
	if d.f != nil {
		d.f.Close()
		d.f = nil
	}
	tmp, created := d.tmp, d.created
	d.tmp, d.created = "", false
	if tmp == "" && !created {
		return
	}
	_ = asuser.Do(d.user, func() error {
		if tmp != "" {
			os.Remove(tmp)
		}
		if created {
			os.Remove(d.target)
		}
		return nil
	})
}

// mkdirAll is os.MkdirAll with an error for a path that exists and is not
// a directory, and without trouble from a directory made concurrently.
func mkdirAll(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("stat directory: %w", err)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, newDirMode); err != nil {
		if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
			return nil // created concurrently
		}
		return fmt.Errorf("make directory: %w", err)
	}
	return nil
}
