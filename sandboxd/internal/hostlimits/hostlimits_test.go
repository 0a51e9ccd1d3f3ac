package hostlimits

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// procSys makes a /proc/sys of its own with the two sysctls.
func procSys(t *testing.T, pidMax, threadsMax string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"pid_max": pidMax, "threads-max": threadsMax} {
		if err := os.WriteFile(filepath.Join(dir, "kernel", name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The neighbour table's bounds are raised to 4 entries per sandbox and
// 1024 for the host; higher ones stay.
func TestCheckNeigh(t *testing.T) {
	for _, c := range []struct {
		name               string
		thresh2, thresh3   string
		max                int
		want2, want3, from int64
	}{
		{"the kernel's defaults, 256 sandboxes: raised", "512", "1024", 256, 1536, 2048, 1024},
		{"the kernel's defaults, 1000 sandboxes: raised", "512", "1024", 1000, 4512, 5024, 1024},
		{"higher stays", "8192", "16384", 1000, 8192, 16384, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			sys := t.TempDir()
			dir := filepath.Join(sys, "net/ipv4/neigh/default")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, v := range map[string]string{"gc_thresh2": c.thresh2, "gc_thresh3": c.thresh3} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			now, from, err := checkNeigh(Options{MaxSandboxes: c.max, ProcSys: sys})
			if err != nil {
				t.Fatal(err)
			}
			if now != c.want3 || from != c.from {
				t.Errorf("gc_thresh3 %d, raised from %d; want %d, from %d", now, from, c.want3, c.from)
			}
			for name, want := range map[string]int64{"gc_thresh2": c.want2, "gc_thresh3": c.want3} {
				if data, _ := os.ReadFile(filepath.Join(dir, name)); strings.TrimSpace(string(data)) != strconv.FormatInt(want, 10) {
					t.Errorf("%s is %q, want %d", name, data, want)
				}
			}
		})
	}
}

// Outside the host's network namespace the bounds are not there to read:
// nothing is checked, and nothing fails.
func TestCheckNeighOutsideTheHostsNetworkNamespace(t *testing.T) {
	now, from, err := checkNeigh(Options{MaxSandboxes: 1000, ProcSys: t.TempDir()})
	if err != nil || now != 0 || from != 0 {
		t.Fatalf("checkNeigh = %d, %d, %v; want 0, 0, nil", now, from, err)
	}
}

func TestCheckPidMax(t *testing.T) {
	for _, c := range []struct {
		name                string
		pidMax, threadsMax  string
		o                   Options
		wantPidMax, wantSbx int64
		wantRaised          int64
		wantErr             string
	}{
		{
			name: "high enough stays", pidMax: "4194304", threadsMax: "190000",
			o:          Options{MaxSandboxes: 256, PidsLimit: 4096, PidsReserve: 4096},
			wantPidMax: 4194304, wantSbx: 190000 - 4096,
		},
		{
			name: "too low is raised to what the flags need", pidMax: "32768", threadsMax: "190000",
			o:          Options{MaxSandboxes: 8, PidsLimit: 4096, PidsReserve: 1024},
			wantPidMax: 8*4096 + 1024, wantSbx: 8*4096 + 1024 - 1024, wantRaised: 32768,
		},
		{
			name: "more than Linux has", pidMax: "32768", threadsMax: "190000",
			o:       Options{MaxSandboxes: 4096, PidsLimit: 4096, PidsReserve: 1},
			wantErr: "more than Linux allows",
		},
		{
			name: "a reserve that leaves less than one sandbox", pidMax: "4194304", threadsMax: "5000",
			o:       Options{MaxSandboxes: 1, PidsLimit: 4096, PidsReserve: 4096},
			wantErr: "fewer than one sandbox's --pids-limit",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			sys := procSys(t, c.pidMax, c.threadsMax)
			c.o.ProcSys = sys
			a, err := checkPidMax(c.o)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.PidMax != c.wantPidMax || a.SandboxPids != c.wantSbx || a.RaisedFrom != c.wantRaised {
				t.Errorf("applied %+v, want pid_max %d, sandboxes %d, raised from %d", a, c.wantPidMax, c.wantSbx, c.wantRaised)
			}
			if data, _ := os.ReadFile(filepath.Join(sys, "kernel/pid_max")); strings.TrimSpace(string(data)) != strconv.FormatInt(c.wantPidMax, 10) {
				t.Errorf("kernel.pid_max is %q, want %d", data, c.wantPidMax)
			}
		})
	}
}

// A pid_max that cannot be raised (a read-only /proc/sys, as in a
// container) stops sandboxd with a message that says what to run.
func TestCheckPidMaxRefusesWhenItCannotRaise(t *testing.T) {
	sys := procSys(t, "32768", "190000")
	name := filepath.Join(sys, "kernel/pid_max")
	if os.Geteuid() == 0 {
		// Root writes any file: a read-only bind mount stops it.
		if err := unix.Mount(name, name, "", unix.MS_BIND, ""); err != nil {
			t.Skipf("bind mount: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(name, unix.MNT_DETACH) })
		if err := unix.Mount("", name, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Chmod(name, 0o444); err != nil {
		t.Fatal(err)
	}
	_, err := checkPidMax(Options{MaxSandboxes: 8, PidsLimit: 4096, PidsReserve: 1024, ProcSys: sys})
	if err == nil || !strings.Contains(err.Error(), "could not raise it") || !strings.Contains(err.Error(), "sysctl -w kernel.pid_max=33792") {
		t.Fatalf("err = %v", err)
	}
}
