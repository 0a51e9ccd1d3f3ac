package files

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/skiff-dev/skiff/envd/internal/ensure"
	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// newFileMode is the mode of a file the routes create; directories are
// ensure.DirMode.
const newFileMode fs.FileMode = 0o644

// destFile is the file an upload or a compose writes. An upload writes in
// place, as e2b's envd does, so a directory watcher sees create and write
// events for the file's own name and never a temporary file. A compose, whose
// destination may be one of its sources, writes a temporary file next to it
// and renames it over the destination on commit.
type destFile struct {
	f       *os.File // nil once closed
	target  string
	tmp     string // the temporary file a replacement writes; "" in place
	created bool   // in place, the upload made the file: abort removes it
}

// How createDest writes.
const (
	inPlace     = false
	replacement = true
)

// createDest opens dest for writing for u, as e2b's envd does: as root,
// so u may write wherever root may. It resolves a symlinked dest to the file
// it points to, creates missing parent directories (owned by u), and opens
// the file truncated (in place) or a temporary file beside it (replacement),
// with the mode of the file that exists, else newFileMode. The file written
// is u's, a file that existed too (e2b's envd chowns it).
func createDest(dest string, u *identity.User, replace bool) (*destFile, error) {
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
	if _, err := ensure.Dirs(dir, u); err != nil {
		return nil, fsError(err, "create directory "+dir)
	}
	d := &destFile{target: target}
	if !replace {
		// Given to u before it is emptied, as e2b's envd chowns a file
		// that exists before it opens it: a chown that fails leaves the
		// file as it was.
		f, err := openFile(target, os.O_WRONLY|os.O_CREATE, mode)
		if err != nil {
			return nil, fsError(err, "create file "+target)
		}
		d.f, d.created = f, created
		if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
			d.abort()
			return nil, fsError(err, "chown "+target)
		}
		if err := f.Truncate(0); err != nil {
			d.abort()
			return nil, fsError(err, "truncate "+target)
		}
		return d, nil
	}
	f, err := os.CreateTemp(dir, ".envd-compose-*")
	if err != nil {
		return nil, fsError(err, "create file in "+dir)
	}
	d.f, d.tmp = f, f.Name()
	if err := f.Chmod(mode); err != nil {
		d.abort()
		return nil, fsError(err, "chmod "+d.tmp)
	}
	if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
		d.abort()
		return nil, fsError(err, "chown "+d.tmp)
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
	if err := os.Rename(d.tmp, d.target); err != nil {
		return fsError(err, "rename to "+d.target)
	}
	d.tmp = ""
	return nil
}

// abort closes the file and removes a replacement, or an in-place file the
// upload created; a file that existed keeps what was written, as with
// e2b's envd.
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
	if tmp != "" {
		os.Remove(tmp)
	}
	if created {
		os.Remove(d.target)
	}
}
