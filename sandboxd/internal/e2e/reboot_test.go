package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

func TestPauseFilesOnlyAndReboot(t *testing.T) {
	t.Run("native", func(t *testing.T) { testPauseFilesOnly(t, newHost(t), "native") })
	t.Run("gvisor", func(t *testing.T) { testPauseFilesOnly(t, gvisorHost(t), "gvisor") })
}

func testPauseFilesOnly(t *testing.T, h *host, runtime string) {
	ctx := context.Background()
	c := h.create(func(r *sandboxdv1.CreateRequest) { r.EnvVars = map[string]string{"FROM_CREATE": "c1"} })
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	// A file on its disk, one in memory, and a process.
	h.mustRun(id, token, "root", "mkdir -p /data && echo kept > /data/f && echo lost > /dev/shm/m && httpd -p 9999 -h /data && echo ok")
	state := func() string {
		got := h.mustRun(id, token, "root", `cat /data/f; cat /dev/shm/m 2>/dev/null || echo no-shm; ps | grep -q "[h]ttpd -p 9999" && echo serving || echo no-server; echo "$FROM_CREATE"`)
		return got.Stdout
	}
	if got := state(); got != "kept\nlost\nserving\nc1\n" {
		t.Fatalf("before the pause: %q", got)
	}
	// Each boot of a sandbox has a boot ID of its own, not the host's nor
	// another sandbox's.
	bootID := func(id, token string) string {
		t.Helper()
		got := h.mustRun(id, token, "user", "cat /proc/sys/kernel/random/boot_id").Stdout
		if len(got) != 37 {
			t.Fatalf("boot_id in %s: %q", id, got)
		}
		return got
	}
	host, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	firstBoot := bootID(id, token)
	other := h.create(nil)
	if firstBoot == string(host) || firstBoot == bootID(other.GetSandbox().GetId(), other.GetEnvdAccessToken()) {
		t.Errorf("the sandbox's boot ID %q is the host's or another sandbox's", firstBoot)
	}
	if got := h.mustRun(id, token, "root", "echo x > /proc/sys/kernel/random/boot_id 2>&1; umount /proc/sys/kernel/random/boot_id 2>&1; cat /proc/sys/kernel/random/boot_id"); !strings.HasSuffix(got.Stdout, firstBoot) {
		t.Errorf("root in the sandbox changed its boot ID: %q", got.Stdout)
	}

	resp, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id, FilesOnly: true}))
	if err != nil {
		t.Fatalf("pause with files only: %v\n%s", err, h.logTail())
	}
	if sb := resp.Msg.GetSandbox(); sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED || !sb.GetFilesOnly() {
		t.Fatalf("paused: %v", sb)
	}
	// Nothing of it runs: the runtime holds no state of it.
	if _, err := os.Stat(filepath.Join(h.state, runtime, "sandboxes", id)); !os.IsNotExist(err) {
		t.Errorf("the runtime keeps the sandbox's directory: %v", err)
	}
	// kill -9 of sandboxd: still paused, with its files.
	h.kill9()
	h.start()
	got, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
	if err != nil || got.Msg.GetSandbox().GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED || !got.Msg.GetSandbox().GetFilesOnly() {
		t.Fatalf("after kill -9: %v %v", got, err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatalf("resume: %v\n%s", err, h.logTail())
	}
	// Booted afresh: the files, the environment and the token; not the
	// memory or the process.
	if got := state(); got != "kept\nno-shm\nno-server\nc1\n" {
		t.Errorf("after the boot: %q", got)
	}
	if got := h.mustRun(id, token, "user", "id -u; hostname"); got.Stdout != "1000\ne2b\n" {
		t.Errorf("after the boot, as user: %q", got.Stdout)
	}
	secondBoot := bootID(id, token)
	if secondBoot == firstBoot {
		t.Errorf("the boot after a files-only pause kept the boot ID %q", firstBoot)
	}
	h.mustRun(id, token, "root", "echo second > /data/g && echo lost > /dev/shm/m && httpd -p 9999 -h /data && echo ok")

	// A pause that kept memory, resumed as a reboot; a resume keeps the
	// boot.
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if got := bootID(id, token); got != secondBoot {
		t.Errorf("a resume changed the boot ID from %q to %q", secondBoot, got)
	}
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id, Reboot: true})); err != nil {
		t.Fatalf("resume as a reboot: %v\n%s", err, h.logTail())
	}
	if got := state(); got != "kept\nno-shm\nno-server\nc1\n" {
		t.Errorf("after the reboot: %q", got)
	}
	if got := bootID(id, token); got == secondBoot {
		t.Errorf("a reboot kept the boot ID %q", got)
	}
	if got := h.mustRun(id, token, "root", "cat /data/g"); !strings.Contains(got.Stdout, "second") {
		t.Errorf("a file written after the first boot: %q", got.Stdout)
	}
	if n := h.layers(t); n != 2 {
		t.Errorf("%d layers, want 2 (one per files-only pause)", n)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if n := h.layers(t); n != 0 {
		t.Errorf("%d layers left after the kill", n)
	}
}

// A paused sandbox across a host reboot: kill -9 of sandboxd, then what a
// reboot takes (every sandbox process, every mount under the state and run
// directories, the network namespaces, cgroups and nftables table) before
// sandboxd starts again. Under the native runtime a pause that kept memory
// keeps the files (the processes died with the host) and resumes as a
// boot; under gVisor the checkpoint on disk restores memory and processes.
func TestPausedAcrossHostReboot(t *testing.T) {
	t.Run("native", func(t *testing.T) { testPausedAcrossHostReboot(t, newHost(t), false) })
	t.Run("gvisor", func(t *testing.T) { testPausedAcrossHostReboot(t, gvisorHost(t), true) })
}

func testPausedAcrossHostReboot(t *testing.T, h *host, keepsMemory bool) {
	ctx := context.Background()
	c := h.create(nil)
	id, tok := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	h.mustRun(id, tok, "root", "mkdir -p /data && echo kept > /data/f")
	word := h.startTicker(id, tok)
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	h.simulateReboot(t)
	got, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
	if err != nil {
		t.Fatalf("after the reboot: %v\n%s", err, h.logTail())
	}
	if sb := got.Msg.GetSandbox(); sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED || sb.GetFilesOnly() == keepsMemory {
		t.Fatalf("after the reboot: state %v, files only %v", sb.GetState(), sb.GetFilesOnly())
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatalf("resume after the reboot: %v\n%s", err, h.logTail())
	}
	if out := h.mustRun(id, tok, "root", "cat /data/f").Stdout; out != "kept\n" {
		t.Errorf("its file after the reboot: %q", out)
	}
	if keepsMemory {
		h.ticking(t, id, tok, word)
	} else if out := h.mustRun(id, tok, "root", "cat /tmp/tick >/dev/null 2>&1; a=$(cat /tmp/tick); sleep 0.5; b=$(cat /tmp/tick); test \"$a\" = \"$b\" && echo still").Stdout; out != "still\n" {
		t.Errorf("a process survived the reboot of a native sandbox: %q", out)
	}
}

// simulateReboot kills sandboxd and takes away what a reboot of the host
// would: every process of the sandboxes (thawed first), every mount under
// the state and run directories (deepest first: the roots, disks, layers,
// the network namespaces), the run directory's files, the sandboxes'
// cgroups and the nftables table. Then sandboxd starts again.
func (h *host) simulateReboot(t *testing.T) {
	t.Helper()
	h.kill9()
	base := filepath.Join("/sys/fs/cgroup", "freezer", ownCgroup(t, "freezer"), h.cgroupParent)
	kids, _ := os.ReadDir(base)
	for _, k := range kids {
		if k.IsDir() {
			_ = os.WriteFile(filepath.Join(base, k.Name(), "freezer.state"), []byte("THAWED"), 0o644)
		}
	}
	pidsDir := filepath.Join("/sys/fs/cgroup", "pids", ownCgroup(t, "pids"), h.cgroupParent)
	waitFor(t, 20*time.Second, "the sandboxes' processes to die", func() bool {
		left := 0
		_ = filepath.WalkDir(pidsDir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					left++
				}
			}
			return nil
		})
		return left == 0
	})
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > 4 && (strings.HasPrefix(f[4], h.state+"/") || strings.HasPrefix(f[4], h.netOpts.RunDir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("unmount %s: %v", m, err)
		}
	}
	if err := os.RemoveAll(h.netOpts.RunDir); err != nil {
		t.Fatal(err)
	}
	for _, ctrl := range []string{"freezer", "pids", "memory", "cpu,cpuacct", "devices", "blkio", "cpuset", "systemd"} {
		dir := filepath.Join("/sys/fs/cgroup", ctrl, ownCgroup(t, strings.Split(ctrl, ",")[0]), h.cgroupParent)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	_ = exec.Command("nft", "delete", "table", "inet", h.netOpts.Table).Run()
	// A reboot ends every process: wait until none holds the state
	// directory's lock (a CI run once started sandboxd again while one
	// still did, for some 100 ms, and it refused to serve).
	lock := filepath.Join(h.state, "sandboxd.lock")
	deadline := time.Now().Add(20 * time.Second)
	for !lockFree(t, lock) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is still held 20 s after sandboxd was killed, by: %s", lock, holders(lock))
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.start()
}

// lockFree reports whether no process holds path's flock.
func lockFree(t *testing.T, path string) bool {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return true
}

// holders names the processes with path open: each one's PID and command.
func holders(path string) string {
	var found []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			if target, _ := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); target == path {
				cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
				found = append(found, p.Name()+" ("+strings.ReplaceAll(strings.TrimSpace(string(cmdline)), "\x00", " ")+")")
				break
			}
		}
	}
	if len(found) == 0 {
		return "no process that /proc shows"
	}
	return strings.Join(found, ", ")
}
