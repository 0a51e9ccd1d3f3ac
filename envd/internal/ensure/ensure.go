// Package ensure creates the directories a file request needs, as e2b's
// envd does (its permissions.EnsureDirs): envd runs as root and makes every
// missing directory itself, mode 0755 (less the umask), then gives it to the
// user the request acts as, so that a request acting as user may write
// where root may and what it creates is user's.
package ensure

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// DirMode is the mode of the directories Dirs makes, before the umask.
const DirMode fs.FileMode = 0o755

// Dirs makes dir and its missing parents, each owned by u, and reports
// whether it made dir itself. A path on the way that exists and is not a
// directory is ENOTDIR; a directory made concurrently is not an error, and
// is given to u too (its maker may not have chowned it yet, as e2b's envd
// reasons).
func Dirs(dir string, u *identity.User) (created bool, err error) {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return false, nil
	case err == nil:
		return false, &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	case !errors.Is(err, fs.ErrNotExist):
		return false, err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if _, err := Dirs(parent, u); err != nil {
			return false, err
		}
	}
	created = true
	if err := os.Mkdir(dir, DirMode); err != nil {
		fi, serr := os.Stat(dir)
		if !errors.Is(err, fs.ErrExist) || serr != nil || !fi.IsDir() {
			return false, err
		}
		created = false // lost a race to another maker
	}
	if err := os.Lchown(dir, int(u.UID), int(u.GID)); err != nil {
		return false, err
	}
	return created, nil
}
