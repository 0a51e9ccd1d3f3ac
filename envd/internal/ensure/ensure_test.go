package ensure_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/ensure"
	"github.com/skiff-dev/skiff/envd/internal/ensure/ensuretest"
)

// TestDirs: the missing directories are made and given to the user, the
// existing ones keep their owner, a file on the way is ENOTDIR, and
// concurrent makers of one tree all succeed with every directory the user's.
func TestDirs(t *testing.T) {
	tr := ensuretest.New(t)
	u := tr.User
	p := filepath.Join(tr.Private, "a", "b")
	created, err := ensure.Dirs(p, u)
	if err != nil || !created {
		t.Fatalf("Dirs = %v, %v; want created", created, err)
	}
	ensuretest.CheckOwner(t, filepath.Join(tr.Private, "a"), u.UID, u.GID)
	ensuretest.CheckOwner(t, p, u.UID, u.GID)
	ensuretest.CheckOwner(t, tr.Private, 0, 0)
	if fi, err := os.Stat(p); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm()&^ensure.DirMode != 0 {
		t.Errorf("mode of %s = %v, want within %v", p, fi.Mode(), ensure.DirMode)
	}
	if created, err := ensure.Dirs(p, u); err != nil || created {
		t.Errorf("Dirs of an existing directory = %v, %v; want not created", created, err)
	}
	if _, err := ensure.Dirs(filepath.Join(tr.Public, "x"), u); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("Dirs under a file = %v, want ENOTDIR", err)
	}

	deep := filepath.Join(tr.RootDir, "c", "d", "e")
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = ensure.Dirs(deep, u) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("concurrent Dirs: %v", err)
		}
	}
	for _, d := range []string{"c", "c/d", "c/d/e"} {
		ensuretest.CheckOwner(t, filepath.Join(tr.RootDir, d), u.UID, u.GID)
	}
}
