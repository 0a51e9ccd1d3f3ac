package mountinfo

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseUnder(t *testing.T) {
	info := `22 1 0:21 / / rw - ext4 /dev/vda rw
30 22 0:5 / /cache/.build-1/proc rw - proc proc rw
31 22 0:6 / /cache/.build-1/dev/pts rw - devpts devpts rw
32 22 0:7 / /cache/.build-10 rw - tmpfs tmpfs rw
33 22 0:8 / /cache/with\040space/.build-2/sys rw - sysfs sysfs rw
34 22 0:9 / /cache/.build-1 rw - tmpfs tmpfs rw
`
	if got := ParseUnder([]byte(info), "/cache/.build-1"); !slices.Equal(got, []string{"/cache/.build-1/proc", "/cache/.build-1/dev/pts", "/cache/.build-1"}) {
		t.Errorf("mounts = %q", got)
	}
	if got := ParseUnder([]byte(info), "/cache/with space/.build-2"); !slices.Equal(got, []string{"/cache/with space/.build-2/sys"}) {
		t.Errorf("escaped mounts = %q", got)
	}
}

func TestUnder(t *testing.T) {
	got, err := Under("/proc")
	if err != nil || !slices.Contains(got, "/proc") {
		t.Errorf("Under(/proc) = %q, %v; want /proc among them", got, err)
	}
	// Through a symbolic link, as the kernel lists it.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink("/proc", link); err != nil {
		t.Fatal(err)
	}
	if got, err := Under(link); err != nil || !slices.Contains(got, "/proc") {
		t.Errorf("Under(%s -> /proc) = %q, %v; want /proc among them", link, got, err)
	}
}
