package hosttest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// AssertHidden fails t unless the test runs where Run puts it: as root, in
// a mount namespace of its own whose /root and /home are tmpfs mounts that
// did not propagate outside, and where a file made in /root is not seen by
// the host. A guarded package calls it from a test of its own, which shows
// that its TestMain calls Run. Not as root, it skips t.
func AssertHidden(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: the tests run in the host's mount namespace, as they are")
	}
	pid, err := outsidePID()
	if err != nil {
		t.Fatalf("not run by hosttest.Run (does TestMain call it?): %v", err)
	}
	if err := check(); err != nil {
		t.Fatal(err)
	}
	outsideRoot := fmt.Sprintf("/proc/%d/root", pid) // "/" as the host sees it
	outsideMounts, err := mountInfo(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := mountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range homes {
		if _, err := os.Stat(outsideRoot + d); err != nil {
			continue
		}
		// The tmpfs on d is a filesystem of its own, mounted nowhere outside.
		m := mounts[d]
		if m.fstype != "tmpfs" {
			t.Fatalf("%s is %s, want tmpfs", d, m.fstype)
		}
		for point, om := range outsideMounts {
			if om.dev == m.dev {
				t.Fatalf("the tmpfs on %s (%s) is mounted outside too, on %s", d, m.dev, point)
			}
		}
		if dev(t, d) == dev(t, outsideRoot+d) {
			t.Fatalf("%s is the same filesystem as the host's %s", d, d)
		}
	}

	// A file made in /root here is not in the host's /root.
	f, err := os.CreateTemp("/root", "hosttest-probe-")
	if err != nil {
		t.Fatal(err)
	}
	probe := f.Name()
	f.Close()
	t.Cleanup(func() { os.Remove(probe) })
	if _, err := os.Lstat(outsideRoot + probe); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the host sees %s (lstat: %v)", probe, err)
	}
	// And so says a process in the host's mount namespace, which sees a
	// file made in the test's temporary folder (/tmp is shared).
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Logf("no nsenter (%v): checked through /proc/%d/root only", err, pid)
		return
	}
	seen := func(p string) bool {
		t.Helper()
		err := exec.Command(nsenter, fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), "--", "test", "-e", p).Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("nsenter: %v", err)
		}
		return err == nil
	}
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.WriteFile(shared, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !seen(shared) {
		t.Fatalf("a process in the host's mount namespace does not see %s: the check itself is broken", shared)
	}
	if seen(probe) {
		t.Fatalf("a process in the host's mount namespace sees %s", probe)
	}
}

// dev is the device of the filesystem p is on.
func dev(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	return st.Dev
}
