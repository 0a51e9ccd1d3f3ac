package native_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/hostlimits"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// withHog starts sandboxes whose root has the hog binary.
func withHog(t *testing.T) func(*sandboxrt.Spec) {
	rootfs := sandboxtest.BusyboxRootfs(t)
	sandboxtest.InstallHog(t, rootfs)
	return func(sp *sandboxrt.Spec) { sp.Rootfs = rootfs }
}

// hog runs the hog in the sandbox as user and returns how much it got and
// what stopped it; with hold, the hog keeps what it took, in the
// background, until the sandbox stops.
func (s *sandbox) hog(t *testing.T, user, what string, n int, hold bool) (int, string) {
	t.Helper()
	cmd := "hog " + what + " " + strconv.Itoa(n)
	if !hold {
		return parseHog(t, s.run(t, user, cmd).Stdout)
	}
	out := "/tmp/hog-" + what + ".out"
	s.run(t, user, cmd+" hold > "+out+" 2>&1 &")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got := s.run(t, user, "cat "+out+" 2>/dev/null").Stdout; got != "" {
			return parseHog(t, got)
		}
		if time.Now().After(deadline) {
			t.Fatalf("hog %s printed nothing in 30 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostHog runs the hog on the host, as this test's user (root).
func hostHog(t *testing.T, what string, n int) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, sandboxtest.Hog(t), what, strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		t.Fatalf("hog %s on the host: %v: %s", what, err, out)
	}
	return parseHog(t, string(out))
}

func parseHog(t *testing.T, out string) (int, string) {
	t.Helper()
	n, stopped, ok := sandboxtest.ParseHog(out)
	if !ok {
		t.Fatalf("hog said %q", out)
	}
	return n, stopped
}

// The kernel's per-user counts (inotify instances, pending signals, message
// queue bytes) of a sandbox are its own: one sandbox that takes all it may
// leaves the host's root and another sandbox what they had. With
// namespaces owned by host root, every sandbox's counts were root's too,
// so one sandbox's 128 inotify instances left the host and everyone else
// with EMFILE.
func TestKernelCountsAreEachSandboxsOwn(t *testing.T) {
	rt, dir := newRuntime(t)
	hog := withHog(t)
	greedy, other := start(t, rt, dir, hog), start(t, rt, dir, hog)

	for _, c := range []struct {
		what string
		ask  int // more than a sandbox may have
		min  int // what it gets at least: the host's default per-user limit, about
		err  string
	}{
		{"inotify", 100_000, 100, "EMFILE"},
		{"sigpending", 10_000_000, 1000, "EAGAIN"},
		{"mqueue", 100_000, 8, "EMFILE"},
	} {
		t.Run(c.what, func(t *testing.T) {
			got, why := greedy.hog(t, "user", c.what, c.ask, true)
			if got < c.min || why != c.err {
				t.Fatalf("the greedy sandbox got %d %s (stopped by %s), want at least %d, stopped by %s", got, c.what, why, c.min, c.err)
			}
			t.Logf("the greedy sandbox holds %d %s", got, c.what)
			if n, why := hostHog(t, c.what, 3); n != 3 {
				t.Errorf("the host's root got %d of 3 %s (%s) while a sandbox holds its share", n, c.what, why)
			}
			if n, why := other.hog(t, "user", c.what, 3, false); n != 3 {
				t.Errorf("another sandbox's user got %d of 3 %s (%s)", n, c.what, why)
			}
			if n, why := other.hog(t, "root", c.what, 3, false); n != 3 {
				t.Errorf("another sandbox's root got %d of 3 %s (%s)", n, c.what, why)
			}
		})
	}
	// Each sandbox's user namespace belongs to the sandbox's own root on
	// the host (the first uid of its range), not to host root.
	for _, s := range []*sandbox{greedy, other} {
		f := strings.Fields(s.run(t, "root", "cat /proc/self/uid_map").Stdout)
		if len(f) != 3 {
			t.Fatalf("uid_map %q", f)
		}
		if owner := usernsOwner(t, rt, s); strconv.Itoa(owner) != f[1] {
			t.Errorf("the user namespace mapping 0 to %s is owned by host uid %d", f[1], owner)
		}
	}
}

// usernsOwner is the host uid that owns the user namespace of the
// sandbox's init.
func usernsOwner(t *testing.T, rt *native.Runtime, s *sandbox) int {
	t.Helper()
	procs := filepath.Join("/sys/fs/cgroup/pids", ownCgroup(t, "pids"), rt.Options().CgroupParent, s.spec.ID, "cgroup.procs")
	data, err := os.ReadFile(procs)
	if err != nil {
		t.Fatal(err)
	}
	pid, _, _ := strings.Cut(string(data), "\n")
	ns, err := os.Open("/proc/" + pid + "/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var uid uint32
	const nsGetOwnerUID = 0xb704 // NS_GET_OWNER_UID, <linux/nsfs.h>
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	return int(uid)
}

// All sandboxes together have at most their parent cgroup's processes,
// whatever each may have: without that bound, eight sandboxes of 4096
// processes each took every PID of a host whose kernel.pid_max is 32768.
// Here two sandboxes of 150 each run fork bombs under a bound of 200.
func TestSandboxesTogetherStayUnderTheHostsBound(t *testing.T) {
	const perSandbox, together = 150, 200
	rt, dir := newRuntime(t, func(o *native.Options) { o.PidsLimit = perSandbox })
	parent := rt.Options().CgroupParent
	if err := hostlimits.BoundSandboxPids(parent, together); err != nil {
		t.Fatal(err)
	}
	hog := withHog(t)
	a, b := start(t, rt, dir, hog), start(t, rt, dir, hog)
	na, _ := a.hog(t, "root", "procs", 400, false)
	nb, _ := b.hog(t, "root", "procs", 400, false)
	t.Logf("the first sandbox holds %d processes, the second %d", na, nb)
	if na > perSandbox || nb > perSandbox {
		t.Errorf("a sandbox holds more than its %d processes: %d, %d", perSandbox, na, nb)
	}
	dirPids, err := cgroups.ControllerPath(parent, "pids")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dirPids, "pids.current"))
	if err != nil {
		t.Fatal(err)
	}
	if cur, _ := strconv.Atoi(strings.TrimSpace(string(data))); cur > together || na+nb > together {
		t.Errorf("the sandboxes hold %d processes together (%d + %d), above the bound of %d", cur, na, nb, together)
	}
	if nb < 10 {
		t.Errorf("the second sandbox got only %d processes: the first took what was left", nb)
	}
	// Each still answers: the first by the pids its workload may not take,
	// which stay for envd; the second, whose workload the host's bound
	// stopped first, as its envd made its threads before the bomb.
	for _, s := range []*sandbox{a, b} {
		if got := s.run(t, "root", "pkill sleep; echo alive").Stdout; !strings.Contains(got, "alive") {
			t.Errorf("after the bomb: %q", got)
		}
	}
}

// A storm of processes that together pass the memory limit (make -j, a
// test runner) costs some of those processes, never envd: every process
// inherited envd's OOM score, and with each smaller than envd the memory
// cgroup's OOM killer took envd, the sandbox's init, and with it the
// whole sandbox. The processes envd starts now rank above it.
func TestAForkStormPastTheMemoryLimitSparesEnvd(t *testing.T) {
	rt, dir := newRuntime(t)
	hog := withHog(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) {
		hog(sp)
		sp.MemoryMiB = 128
	})
	// 40 processes of 6 MiB each: 240 MiB in a sandbox of 128, each
	// smaller than envd.
	got := s.run(t, "user", "for i in $(seq 40); do hog mem 6 hold >/dev/null 2>&1 & done; sleep 3; echo storm-over")
	if !strings.Contains(got.Stdout, "storm-over") {
		t.Fatalf("the storm: %+v", got)
	}
	if st, err := rt.Status(context.Background(), s.spec.ID); err != nil || st != sandboxrt.Running {
		t.Fatalf("after the storm the sandbox is %v (%v)", st, err)
	}
	if got := s.run(t, "root", "pkill hog; cat /proc/1/oom_score_adj; echo alive"); !strings.HasSuffix(got.Stdout, "alive\n") {
		t.Errorf("envd after the storm: %+v", got)
	}
	// What envd starts ranks above envd for the OOM killer.
	if f := strings.Fields(s.run(t, "user", "cat /proc/self/oom_score_adj /proc/1/oom_score_adj").Stdout); len(f) != 2 || f[0] != "1000" || f[1] == "1000" {
		t.Errorf("oom_score_adj of a command and of envd: %q", f)
	}
}

// A sandbox's writes stop at its disk size, with ENOSPC inside it, and
// take no more of the host's disk; its use is measured without walking its
// files. Before, the upper layer sat on the host's filesystem: 1 GiB
// written went straight to the host, and the use read 0.
func TestADiskFillStopsAtTheSandboxsDisk(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.DiskMiB = 64 })
	got := s.run(t, "user", "dd if=/dev/zero of=/home/user/fill bs=1M count=200 2>&1; echo exit=$?")
	if !strings.Contains(got.Stdout, "No space left on device") || strings.Contains(got.Stdout, "exit=0") {
		t.Errorf("writing 200 MiB on a disk of 64: %q", got.Stdout)
	}
	st, err := rt.Stats(context.Background(), s.spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.DiskLimit != 64<<20 || st.DiskUsed < 48<<20 || st.DiskUsed > st.DiskLimit {
		t.Errorf("disk used %d of %d bytes after filling it", st.DiskUsed, st.DiskLimit)
	}
	// The host holds what the sandbox wrote, no more.
	var img unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "native", "sandboxes", s.spec.ID, "disk.img"), &img); err != nil {
		t.Fatal(err)
	}
	if host := img.Blocks * 512; host > 72<<20 {
		t.Errorf("the host's disk holds %d bytes of a sandbox of 64 MiB", host)
	}
	// Space freed inside is free again.
	s.run(t, "user", "rm /home/user/fill; sync")
	if st, err := rt.Stats(context.Background(), s.spec.ID); err != nil || st.DiskUsed > 8<<20 {
		t.Errorf("disk used %d bytes after the file went (%v)", st.DiskUsed, err)
	}
	if got := s.run(t, "user", "echo fits > /home/user/small && cat /home/user/small").Stdout; got != "fits\n" {
		t.Errorf("writing after the fill: %q", got)
	}
}

// envd's log is on the sandbox's own disk, where the sandbox cannot see
// it, so whatever is written to it fills that disk and not the host's.
func TestTheLogIsOnTheSandboxsDisk(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.DiskMiB = 64 })
	s.run(t, "user", "echo hello-log")
	target, err := os.Readlink(s.spec.Log)
	if err != nil {
		t.Fatalf("the log is not a link to the sandbox's disk: %v", err)
	}
	var disk, logf unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "native", "sandboxes", s.spec.ID, "disk"), &disk); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(target, &logf); err != nil {
		t.Fatal(err)
	}
	if disk.Dev != logf.Dev {
		t.Errorf("the log %s is not on the sandbox's disk", target)
	}
	if data, err := os.ReadFile(s.spec.Log); err != nil || !strings.Contains(string(data), "hello-log") {
		t.Errorf("the log has not the command's output (%v)", err)
	}
	if got := s.run(t, "root", "find / -xdev -name envd.log 2>/dev/null | wc -l").Stdout; strings.TrimSpace(got) != "0" {
		t.Errorf("the sandbox sees its log: %q", got)
	}
}
