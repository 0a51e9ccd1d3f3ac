package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every path is under /sys/fs/cgroup, ends in rel, and is one per line of
// /proc/self/cgroup.
func TestPaths(t *testing.T) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip("no /proc/self/cgroup here")
	}
	paths, err := Paths("skiff-test/x")
	if err != nil {
		t.Fatal(err)
	}
	if want := len(strings.Split(strings.TrimSpace(string(data)), "\n")); len(paths) != want {
		t.Fatalf("%d paths for %d hierarchies: %v", len(paths), want, paths)
	}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/sys/fs/cgroup/") || !strings.HasSuffix(p, "/skiff-test/x") {
			t.Errorf("path %q", p)
		}
	}
}

// Remove removes the cgroup from every hierarchy (as root), with its
// workload cgroup, and a cgroup that is not there is no error.
func TestRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a cgroup")
	}
	rel := "skiff-cgroups-test"
	if err := Remove(rel); err != nil {
		t.Fatalf("Remove of a cgroup that is not there: %v", err)
	}
	paths, err := Paths(rel)
	if err != nil {
		t.Fatal(err)
	}
	var made []string
	for _, p := range paths {
		if err := os.Mkdir(p, 0o755); err == nil {
			made = append(made, p)
			if err := os.Mkdir(filepath.Join(p, Workload), 0o755); err != nil {
				t.Errorf("a cgroup below %s: %v", p, err)
			}
		}
	}
	t.Cleanup(func() {
		for _, p := range made {
			_ = os.Remove(filepath.Join(p, Workload))
			_ = os.Remove(p)
		}
	})
	if len(made) == 0 {
		t.Skip("no writable cgroup hierarchy here")
	}
	if err := Remove(rel); err != nil {
		t.Fatal(err)
	}
	for _, p := range made {
		if _, err := os.Stat(filepath.Clean(p)); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", p, err)
		}
	}
}

// ControllerPath finds the hierarchy that has the controller, and refuses
// one that no hierarchy has.
func TestControllerPath(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		t.Skip("no cgroups here")
	}
	p, err := ControllerPath("skiff-test/x", "pids")
	if err != nil {
		t.Skipf("no pids controller here: %v", err)
	}
	if !strings.HasSuffix(p, "/skiff-test/x") {
		t.Errorf("path %q", p)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(p)), "pids.max")); err != nil && !strings.HasPrefix(p, "/sys/fs/cgroup/pids/") {
		t.Errorf("%s is not in the pids hierarchy", p)
	}
	if _, err := ControllerPath("x", "no-such-controller"); !errors.Is(err, ErrNoController) {
		t.Errorf("unknown controller: %v", err)
	}
}
