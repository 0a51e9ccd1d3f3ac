package native_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer/system"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/sandboxd/internal/selfexe"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

func init() {
	if err := native.ReexecSealed(); err != nil {
		panic(err)
	}
}

type sandbox struct {
	rt   *native.Runtime
	dir  string
	spec *sandboxrt.Spec
	envd *sandboxtest.Envd
}

func newRuntime(t testing.TB, edit ...func(*native.Options)) (*native.Runtime, string) {
	t.Helper()
	sandboxtest.RequireRoot(t)
	dir := sandboxtest.Dir(t)
	opts := native.DefaultOptions(filepath.Join(dir, "native"))
	opts.CgroupParent = sandboxtest.CgroupParent(t)
	opts.UIDBase = hosttest.UIDBase()
	for _, e := range edit {
		e(&opts)
	}
	rt, err := native.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	return rt, dir
}

// start starts a sandbox on a busybox root and waits for its envd.
func start(t *testing.T, rt *native.Runtime, dir string, edit func(*sandboxrt.Spec)) *sandbox {
	t.Helper()
	spec := newSpec(t, dir)
	if edit != nil {
		edit(spec)
	}
	if err := rt.Start(context.Background(), spec); err != nil {
		t.Fatalf("start: %v", err)
	}
	return started(t, rt, dir, spec)
}

// started stops the sandbox of spec when the test ends, and waits for its
// envd.
func started(t *testing.T, rt *native.Runtime, dir string, spec *sandboxrt.Spec) *sandbox {
	t.Helper()
	t.Cleanup(func() {
		if err := rt.Stop(context.Background(), spec.ID); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	e := sandboxtest.NewEnvd("http://127.0.0.1:49983", sandboxtest.NetnsDialer(spec.NetNS))
	e.WaitHealthy(t, 10*time.Second)
	return &sandbox{rt: rt, dir: dir, spec: spec, envd: e}
}

// newSpec is the spec of a small sandbox on a busybox root.
func newSpec(t *testing.T, dir string) *sandboxrt.Spec {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag("native-test"))
	if err != nil {
		t.Fatal(err)
	}
	ns := sandboxtest.Netns(t)
	spec := &sandboxrt.Spec{
		ID:        id,
		Rootfs:    sandboxtest.BusyboxRootfs(t),
		CPUMilli:  1000,
		MemoryMiB: 128,
		DiskMiB:   256,
		NetNS:     ns,
		Hostname:  "sbx-" + id[:6],
		Envd:      sandboxtest.EnvdBinary(t),
		EnvdArgs:  []string{"--port", "49983"},
		Files:     map[string][]byte{"/etc/hosts": []byte("127.0.0.1 localhost\n")},
		Log:       filepath.Join(dir, id+".log"),
	}
	return spec
}

func (s *sandbox) run(t *testing.T, user, script string) sandboxtest.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.envd.Run(ctx, user, "", script)
	if err != nil {
		t.Fatalf("run %q as %s: %v", script, user, err)
	}
	return res
}

func TestSandboxRunsEnvdAsInitWithUsers(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sandboxtest.InstallHog(t, sp.Rootfs) })

	if got := s.run(t, "user", "id -u; id -g; pwd; hostname"); got.Stdout != "1000\n1000\n/home/user\n"+s.spec.Hostname+"\n" {
		t.Errorf("as user: %+v", got)
	}
	if got := s.run(t, "root", "id -u"); got.Stdout != "0\n" {
		t.Errorf("as root: %+v", got)
	}
	// envd is the sandbox's init, and the only processes are the sandbox's.
	if got := s.run(t, "root", "cat /proc/1/cmdline | tr '\\0' ' '; ls /proc | grep -c '^[0-9]'"); !strings.HasPrefix(got.Stdout, "/usr/bin/envd --port 49983") {
		t.Errorf("pid 1 = %q", got.Stdout)
	} else if n, _ := strconv.Atoi(strings.TrimSpace(strings.Fields(got.Stdout)[len(strings.Fields(got.Stdout))-1])); n > 8 {
		t.Errorf("the sandbox sees %d processes: %q", n, got.Stdout)
	}
	// The host's own processes and files are not there.
	if got := s.run(t, "root", "test -e /proc/"+strconv.Itoa(os.Getpid())+" && echo visible; test -e "+dir+" && echo host-dir; echo done"); got.Stdout != "done\n" {
		t.Errorf("host leaks into the sandbox: %q", got.Stdout)
	}
	// envd is read-only; the root is writable by root only, through the
	// sandbox's private layer, and the template is untouched.
	if got := s.run(t, "root", "echo x > /usr/bin/envd || echo refused"); !strings.Contains(got.Stdout, "refused") {
		t.Errorf("envd writable: %+v", got)
	}
	if got := s.run(t, "root", "echo hello > /etc/motd && cat /etc/motd"); got.Stdout != "hello\n" {
		t.Errorf("write as root: %+v", got)
	}
	if got := s.run(t, "user", "echo x > /etc/passwd || echo denied"); !strings.Contains(got.Stdout, "denied") {
		t.Errorf("user wrote /etc/passwd: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(s.spec.Rootfs, "etc/motd")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the template was written: %v", err)
	}
	// Root in the sandbox holds no capability on the host.
	if got := s.run(t, "root", "grep CapEff /proc/self/status; cat /proc/self/uid_map"); !strings.Contains(got.Stdout, " "+strconv.FormatUint(uint64(rt.Options().UIDBase), 10)+" ") {
		t.Errorf("not in a mapped user namespace: %q", got.Stdout)
	}
	// No mounts (no CAP_SYS_ADMIN); no_new_privs off, so that setuid
	// programs (sudo) work, as in Docker.
	if got := s.run(t, "root", "mount -t tmpfs none /mnt 2>&1 && echo mounted; grep NoNewPrivs /proc/self/status"); strings.Contains(got.Stdout, "mounted") || !strings.Contains(got.Stdout, "NoNewPrivs:\t0") {
		t.Errorf("mount or no_new_privs: %q", got.Stdout)
	}
	if got := s.run(t, "root", "grep Seccomp: /proc/self/status"); !strings.Contains(got.Stdout, "Seccomp:\t2") {
		t.Errorf("no seccomp filter: %q", got.Stdout)
	}
	// The filter is Docker's default profile, patched as runc patches it:
	// no new user namespace without CAP_SYS_ADMIN (unshare(CLONE_NEWUSER),
	// which the kernel alone would allow), no reboot, and ENOSYS, not
	// EPERM, for a system call newer than the profile, so that programs
	// fall back.
	if runtime.GOARCH == "amd64" {
		// unshare(CLONE_NEWUSER), reboot(0), number 1000, getpid
		if got := s.run(t, "root", "/usr/bin/hog syscall 272:0x10000000 169 1000 39"); got.Stdout != "EPERM EPERM ENOSYS none\n" {
			t.Errorf("system calls under the filter: got %+v, want EPERM EPERM ENOSYS none", got)
		}
	}
	// /dev: the host's devices (bind mounts: no mknod in a user
	// namespace), and the links runc makes (made through one handle of
	// /dev by our fork's patch 0003).
	want := "/dev/null 1:3\n/dev/zero 1:5\n/dev/full 1:7\n/dev/random 1:8\n/dev/urandom 1:9\n/dev/tty 5:0\n" +
		"fd /proc/self/fd\nstdin /proc/self/fd/0\nstdout /proc/self/fd/1\nstderr /proc/self/fd/2\nptmx pts/ptmx\n"
	if _, err := os.Stat("/proc/kcore"); err == nil {
		want += "core /proc/kcore\n"
	} else {
		want += "core\n"
	}
	want += "written 4\n"
	script := "for n in null zero full random urandom tty; do stat -c '%n %t:%T' /dev/$n; done; " +
		"for l in fd stdin stdout stderr ptmx core; do echo $l $(readlink /dev/$l); done; " +
		"echo x > /dev/null && echo written $(head -c 4 /dev/zero | wc -c)"
	if got := s.run(t, "root", script); got.Stdout != want {
		t.Errorf("/dev:\n%s%s\nwant:\n%s", got.Stdout, got.Stderr, want)
	}
	if st, err := rt.Status(context.Background(), s.spec.ID); err != nil || st != sandboxrt.Running {
		t.Errorf("status = %v, %v", st, err)
	}
}

func TestMemoryHogIsKilledInsideTheSandbox(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.MemoryMiB = 64 })
	got := s.run(t, "user", "head -c 300m /dev/zero | tail > /dev/null; echo exit=$?")
	if !strings.Contains(got.Stdout, "exit=137") {
		t.Errorf("the hog was not OOM-killed: %+v", got)
	}
	// The sandbox (and envd, its init) lives on.
	if got := s.run(t, "user", "echo alive"); got.Stdout != "alive\n" {
		t.Errorf("after the OOM kill: %+v", got)
	}
	st, err := rt.Stats(context.Background(), s.spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryLimit != 64<<20 || st.MemoryUsed <= 0 || st.CPUUsage <= 0 {
		t.Errorf("stats = %+v", st)
	}
	// Memory a process holds counts; the CPU it burns adds up.
	s.run(t, "user", "head -c 40m /dev/zero | tail -c 40m > /dev/null & i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	s.run(t, "user", "(head -c 32m /dev/zero > /dev/shm/held) && echo ok")
	st2, err := rt.Stats(context.Background(), s.spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st2.CPUUsage < st.CPUUsage+50*time.Millisecond || st2.MemoryUsed < st.MemoryUsed+30<<20 {
		t.Errorf("after a busy loop and 32 MiB in /dev/shm: stats %+v, before %+v", st2, st)
	}
}

func TestPauseFreezesAndResumeThaws(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, nil)
	ctx := context.Background()
	s.run(t, "user", "(i=0; while :; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/tick; sleep 0.01; done) >/dev/null 2>&1 </dev/null & sleep 0.05")
	if err := rt.Pause(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := rt.Status(ctx, s.spec.ID); st != sandboxrt.Paused {
		t.Fatalf("status after pause = %v", st)
	}
	tick := filepath.Join(s.rootfsUpper(), "tmp", "tick")
	before, err := os.ReadFile(tick)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if after, _ := os.ReadFile(tick); string(after) != string(before) {
		t.Error("processes ran while paused")
	}
	// Stats work on a paused sandbox.
	if _, err := rt.Stats(ctx, s.spec.ID); err != nil {
		t.Error(err)
	}
	if err := rt.Resume(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
	if got := s.run(t, "user", "sleep 0.05; cat /tmp/tick"); got.Stdout == string(before) {
		t.Errorf("the loop did not resume: %q", got.Stdout)
	}
}

func (s *sandbox) rootfsUpper() string {
	return filepath.Join(s.dir, "native", "sandboxes", s.spec.ID, "disk", "upper")
}

func TestStopRemovesEverythingAndIsIdempotent(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, nil)
	ctx := context.Background()
	// A paused sandbox stops too.
	if err := rt.Pause(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Status(ctx, s.spec.ID); !errors.Is(err, sandboxrt.ErrNotFound) {
		t.Errorf("status after stop: %v", err)
	}
	if _, err := rt.Stats(ctx, s.spec.ID); !errors.Is(err, sandboxrt.ErrNotFound) {
		t.Errorf("Stats after Stop = %v, want ErrNotFound", err)
	}
	if err := rt.Stop(ctx, s.spec.ID); err != nil {
		t.Errorf("second stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "native", "sandboxes", s.spec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layers left: %v", err)
	}
	for _, hierarchy := range []string{"memory", "pids", "cpu", "freezer"} {
		own := ownCgroup(t, hierarchy)
		p := filepath.Join("/sys/fs/cgroup", hierarchy, own, rt.Options().CgroupParent, s.spec.ID)
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left: %v", p, err)
		}
	}
	if ids, _ := rt.List(ctx); len(ids) != 0 {
		t.Errorf("runtime still lists %v", ids)
	}
}

// ownCgroup is this process's cgroup in a v1 hierarchy.
func ownCgroup(t *testing.T, hierarchy string) string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+hierarchy+",") {
			return parts[2]
		}
	}
	return "/"
}

func TestANewRuntimeFindsTheSandboxesOfTheOldOne(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, nil)
	ctx := context.Background()
	again, err := native.New(rt.Options())
	if err != nil {
		t.Fatal(err)
	}
	if st, err := again.Status(ctx, s.spec.ID); err != nil || st != sandboxrt.Running {
		t.Fatalf("status through a new runtime = %v, %v", st, err)
	}
	if ids, _ := again.List(ctx); len(ids) != 1 || ids[0] != s.spec.ID {
		t.Errorf("list = %v", ids)
	}
	// A second sandbox gets another uid range than the adopted one.
	other := start(t, again, dir, nil)
	if got := other.run(t, "root", "cat /proc/self/uid_map"); strings.Contains(got.Stdout, " "+strconv.FormatUint(uint64(rt.Options().UIDBase), 10)+" ") {
		t.Errorf("the new sandbox reuses the adopted one's uid range: %q", got.Stdout)
	}
	if err := again.Stop(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
}

// After ReexecSealed (in init), the process runs from a sealed copy, and
// selfexe still names the binary on disk, whose neighbours (envd) sandboxd
// looks for.
func TestSealedRunKnowsItsBinaryOnDisk(t *testing.T) {
	sandboxtest.RequireRoot(t)
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(exe, "/memfd:") {
		t.Fatalf("not running from a sealed copy: /proc/self/exe -> %s", exe)
	}
	onDisk, err := selfexe.Path()
	if err != nil {
		t.Fatal(err)
	}
	disk, err := os.Stat(onDisk)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !disk.Mode().IsRegular() || disk.Size() != self.Size() {
		t.Errorf("selfexe.Path() = %s (%v, %d bytes); the running copy has %d bytes", onDisk, disk.Mode(), disk.Size(), self.Size())
	}
}

// Stop returns once every process of the sandbox is gone, not only its
// init: it waits for the init's reaping, which the kernel does after the
// rest of its pid namespace has exited. Both ways are checked: the
// runtime that started the sandbox (its reaper) and a new one (polling).
func TestStopWaitsForEveryProcess(t *testing.T) {
	for _, restarted := range []bool{false, true} {
		t.Run(map[bool]string{false: "started here", true: "after a restart"}[restarted], func(t *testing.T) {
			rt, dir := newRuntime(t)
			s := start(t, rt, dir, nil)
			s.run(t, "root", "for i in $(seq 40); do sleep 1000 >/dev/null 2>&1 & done")
			// envd in the sandbox's cgroup, what it started in the workload
			// cgroup below.
			var pids []string
			for _, dir := range []string{"", "workload"} {
				data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", ownCgroup(t, "pids"), rt.Options().CgroupParent, s.spec.ID, dir, "cgroup.procs"))
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, strings.Fields(string(data))...)
			}
			if len(pids) < 41 {
				t.Fatalf("the sandbox has %d processes, want envd and 40 sleeps", len(pids))
			}
			starts := map[int]uint64{}
			for _, pid := range pids {
				n, err := strconv.Atoi(pid)
				if err != nil {
					t.Fatal(err)
				}
				st, err := system.Stat(n)
				if err != nil {
					t.Fatal(err)
				}
				starts[n] = st.StartTime
			}
			if restarted {
				again, err := native.New(rt.Options())
				if err != nil {
					t.Fatal(err)
				}
				rt = again
				t.Cleanup(func() { _ = rt.Close() })
			}
			if err := rt.Stop(context.Background(), s.spec.ID); err != nil {
				t.Fatal(err)
			}
			for pid, start := range starts {
				if st, err := system.Stat(pid); err == nil && st.StartTime == start {
					t.Errorf("process %d of the sandbox still runs after Stop", pid)
				}
			}
		})
	}
}

// A sandbox's processes are in its own cgroup, below sandboxd's, in each
// hierarchy of a controller sandboxd uses: where libcontainer.Create would
// have put them had it found the paths itself (the runtime finds them
// once); in the other hierarchies they stay in sandboxd's.
func TestSandboxCgroups(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, nil)
	own, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil || len(own) == 0 {
		t.Fatalf("this process's cgroups: %v, %v", own, err)
	}
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", ownCgroup(t, "pids"), rt.Options().CgroupParent, s.spec.ID, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	pids := strings.Fields(string(procs))
	if len(pids) == 0 {
		t.Fatal("no process in the sandbox's pids cgroup")
	}
	sandbox, err := cgroups.ParseCgroupFile("/proc/" + pids[0] + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if len(sandbox) != len(own) {
		t.Fatalf("the sandbox's process is in %d hierarchies, this process in %d", len(sandbox), len(own))
	}
	// Its own cgroup in the hierarchies of the controllers sandboxd uses
	// (cgroup v2's one), this process's in the others.
	uses := []string{"cpu", "cpuacct", "memory", "pids", "devices", "freezer"}
	v2, joined := cgroups.IsCgroup2UnifiedMode(), 0
	for controller, path := range own {
		want := path
		if v2 || slices.Contains(uses, controller) {
			want = filepath.Join(path, rt.Options().CgroupParent, s.spec.ID)
			joined++
		}
		if sandbox[controller] != want {
			t.Errorf("hierarchy %q: the sandbox is in %s, want %s", controller, sandbox[controller], want)
		}
	}
	if want := len(uses); !v2 && joined != want {
		t.Errorf("the sandbox has a cgroup of its own in %d hierarchies, want %d (%v): this host mounts %v", joined, want, uses, own)
	}
}

// With RunDir, libcontainer's state of a sandbox is there, not in Dir; a
// runtime with RunDir still finds, runs and stops a sandbox that a runtime
// without one (a sandboxd before RunDir) left its state for in Dir.
func TestRunDirHoldsLibcontainerState(t *testing.T) {
	runDir := filepath.Join(sandboxtest.Dir(t), "run")
	rt, dir := newRuntime(t, func(o *native.Options) { o.RunDir = runDir })
	s := start(t, rt, dir, nil)
	if _, err := os.Stat(filepath.Join(runDir, "containers", s.spec.ID, "state.json")); err != nil {
		t.Errorf("libcontainer's state is not in RunDir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rt.Options().Dir, "containers", s.spec.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("libcontainer's state of a sandbox in Dir as well: %v", err)
	}

	old, dir := newRuntime(t)
	legacy := start(t, old, dir, nil)
	_ = old.Close()
	opts := old.Options()
	opts.RunDir = filepath.Join(dir, "run")
	rt, err := native.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	ids, err := rt.List(context.Background())
	if err != nil || !slices.Contains(ids, legacy.spec.ID) {
		t.Fatalf("List with RunDir: %v, %v; want %s, whose state is in Dir", ids, err, legacy.spec.ID)
	}
	if st, err := rt.Status(context.Background(), legacy.spec.ID); err != nil || st != sandboxrt.Running {
		t.Fatalf("Status with RunDir of a sandbox whose state is in Dir: %v, %v", st, err)
	}
	legacy.run(t, "root", "true")
	if err := rt.Stop(context.Background(), legacy.spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(opts.Dir, "containers", legacy.spec.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("its state in Dir after Stop: %v", err)
	}
}

// A sandbox starts on a stack of snapshot layers deeper than mount(2)'s one
// page of overlay options holds (each layer its own fsconfig call), and
// sees the topmost layer's files over the others'.
func TestDeepLayerStack(t *testing.T) {
	rt, dir := newRuntime(t)
	const n = 300
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.Layers = sandboxtest.Layers(t, n) })
	if got := s.run(t, "user", "cat /top; echo; ls / | grep -c '^layer'"); got.Stdout != fmt.Sprintf("0\n%d\n", n) {
		t.Errorf("on %d layers: %+v", n, got)
	}
}

// On a kernel before 6.8 the root is mounted by mount(2), its layers in one
// option: a sandbox on a few layers starts so, and one on more than a page
// of them by path too (by descriptor; it failed before).
func TestLayerStackByMount2(t *testing.T) {
	sandboxtest.Mount2(t)
	rt, dir := newRuntime(t)
	for _, n := range []int{20, 300} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.Layers = sandboxtest.Layers(t, n) })
			if got := s.run(t, "user", "cat /top; echo; ls / | grep -c '^layer'"); got.Stdout != fmt.Sprintf("0\n%d\n", n) {
				t.Errorf("on %d layers by mount(2): %+v", n, got)
			}
		})
	}
}
