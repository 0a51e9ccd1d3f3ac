package native_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/shared/mountinfo"
)

// A sandbox's mount namespace is made from the runtime's base one, which
// has none of the mounts below the runtime's directories (a sandbox's root
// and disk, those a previous sandboxd left), made before or after it, and
// the sandbox starts and runs from it with its root carried in.
func TestSandboxMountNamespaceFromTheBase(t *testing.T) {
	var leftover, other string
	rt, dir := newRuntime(t, func(o *native.Options) {
		// Mounts that were there before the runtime opened: its
		// directory, on a filesystem of its own below one of its
		// private directories (kept: the init needs it); one below its
		// directory (a sandbox of a previous sandboxd) and one below a
		// private directory (gone); one elsewhere (kept).
		leftover = filepath.Join(o.Dir, "sandboxes", "leftover", "rootfs")
		o.PrivateDirs = []string{filepath.Dir(o.Dir)}
		other = t.TempDir()
		for _, d := range []string{o.Dir, leftover, filepath.Join(filepath.Dir(o.Dir), "volumes", "v"), other} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=256m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(d, unix.MNT_DETACH) })
		}
	})
	s := start(t, rt, dir, nil)
	if !rt.InitInC(s.spec.ID) {
		t.Fatal("the init was not done in C")
	}
	if got := s.run(t, "root", "ls /bin >/dev/null && echo ok"); strings.TrimSpace(got.Stdout) != "ok" {
		t.Fatalf("the sandbox does not run: %+v", got)
	}
	base, err := rt.BaseMountinfo()
	if err != nil {
		t.Fatal(err)
	}
	if base == "" {
		t.Fatal("the runtime has no base mount namespace")
	}
	host, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	nativeDir := filepath.Join(dir, "native")
	root := filepath.Join(nativeDir, "sandboxes", s.spec.ID, "rootfs")
	if !slices.Contains(mountinfo.ParseUnder(host, nativeDir), root) {
		t.Fatalf("the sandbox's root %s is not mounted on the host", root)
	}
	for _, mp := range mountinfo.ParseUnder([]byte(base), filepath.Dir(nativeDir)) {
		if strings.HasPrefix(mp, nativeDir+"/") || strings.HasPrefix(mp, filepath.Join(dir, "volumes")+"/") {
			t.Errorf("the base mount namespace has %s", mp)
		}
	}
	if !slices.Contains(mountinfo.ParseUnder([]byte(base), nativeDir), nativeDir) {
		t.Errorf("the base mount namespace lost %s, the runtime's directory", nativeDir)
	}
	if !slices.Contains(mountinfo.ParseUnder([]byte(base), other), other) {
		t.Errorf("the base mount namespace lost %s, a mount outside the runtime's directories", other)
	}
	if !slices.Contains(mountinfo.ParseUnder([]byte(base), "/"), "/") {
		t.Errorf("the base mount namespace has no root: %s", base)
	}
}
