package native

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The files written into a sandbox's root make the directories the
// template lacks, each owned by the sandbox's root, follow a relative
// symlink within the root, and replace one to an absolute path (which
// the root cannot follow) by a directory, as gVisor's tar does.
func TestWriteFilesMakesParents(t *testing.T) {
	const uid = 54321
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, dir string)
		// dirs are the directories the sandbox's root must own after.
		dirs []string
	}{
		{"no /run", func(*testing.T, string) {}, []string{"run", "run/e2b"}},
		{"/run there", func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "run")) }, []string{"run/e2b"}},
		{"/run to /var/run, relative", func(t *testing.T, dir string) {
			mkdir(t, filepath.Join(dir, "var/run"))
			if err := os.Symlink("var/run", filepath.Join(dir, "run")); err != nil {
				t.Fatal(err)
			}
		}, []string{"var/run/e2b"}},
		{"/run to an absolute path", func(t *testing.T, dir string) {
			if err := os.Symlink("/nonexistent-skiff-test", filepath.Join(dir, "run")); err != nil {
				t.Fatal(err)
			}
		}, []string{"run", "run/e2b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.prepare(t, dir)
			if err := writeFiles(dir, map[string][]byte{"/run/e2b/.E2B_SANDBOX_ID": []byte("abc"), "/etc/hosts": []byte("h")}, uid); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "run/e2b/.E2B_SANDBOX_ID")); err != nil || string(b) != "abc" {
				t.Fatalf("the file: %q, %v", b, err)
			}
			for _, d := range append(tc.dirs, "run/e2b/.E2B_SANDBOX_ID", "etc") {
				fi, err := os.Lstat(filepath.Join(dir, d))
				if err != nil || fi.Sys().(*syscall.Stat_t).Uid != uid {
					t.Errorf("%s: %v, %v; want it the sandbox root's", d, fi, err)
				}
			}
		})
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}
