package gvisor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/gvisor"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// helperEnv, when set, makes the test binary start one sandbox (the JSON
// of a helperJob), print "started" and wait to be killed.
const helperEnv = "SKIFF_GVISOR_TEST_START"

type helperJob struct {
	Opts gvisor.Options
	Spec sandboxrt.Spec
}

func TestMain(m *testing.M) {
	if job := os.Getenv(helperEnv); job != "" {
		os.Exit(startAndHang(job))
	}
	os.Exit(m.Run())
}

func startAndHang(job string) int {
	var j helperJob
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rt, err := gvisor.New(j.Opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := rt.Start(context.Background(), &j.Spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("started")
	select {}
}

// envdPort is where envd listens in the test sandboxes.
const envdPort = "49983"

// Addresses of the veth pair between a test sandbox's namespace (eth0)
// and its client's.
const (
	clientAddr  = "169.254.1.1/30"
	sandboxAddr = "169.254.1.2/30"
	sandboxIP   = "169.254.1.2"
)

var runscPath = sync.OnceValue(func() string {
	if p := os.Getenv("SKIFF_RUNSC"); p != "" {
		return p
	}
	out, err := exec.Command(filepath.Join("..", "..", "..", "..", "hack", "runsc", "build.sh"), "--print").Output()
	if err != nil {
		return ""
	}
	p := strings.TrimSpace(string(out))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
})

// runsc returns the runsc binary the tests use, or skips.
func runsc(t testing.TB) string {
	t.Helper()
	p := runscPath()
	if p == "" {
		t.Skip("no runsc: set SKIFF_RUNSC, or build it with hack/runsc/build.sh (make runsc)")
	}
	return p
}

func newRuntime(t testing.TB) (*gvisor.Runtime, string) {
	t.Helper()
	sandboxtest.RequireRoot(t)
	bin := runsc(t)
	dir := sandboxtest.Dir(t)
	opts := gvisor.DefaultOptions(filepath.Join(dir, "gvisor"), bin)
	opts.CgroupParent = sandboxtest.CgroupParent(t)
	rt, err := gvisor.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
	})
	return rt, dir
}

// vethNetns returns two network namespaces joined by a veth pair: the
// sandbox's (eth0, sandboxAddr, a default route through the client) and its
// client's (clientAddr). runsc's network stack serves the sandbox's eth0;
// it cannot be reached through the namespace's loopback.
func vethNetns(t testing.TB) (sandboxNS, clientNS string) {
	t.Helper()
	sandboxNS, clientNS = sandboxtest.Netns(t), sandboxtest.Netns(t)
	sns, err := netns.GetFromPath(sandboxNS)
	if err != nil {
		t.Fatal(err)
	}
	defer sns.Close()
	cns, err := netns.GetFromPath(clientNS)
	if err != nil {
		t.Fatal(err)
	}
	defer cns.Close()
	client, err := netlink.NewHandleAt(cns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sandbox, err := netlink.NewHandleAt(sns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer sandbox.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "h0"
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(sns)}
	if err := client.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for _, end := range []struct {
		h          *netlink.Handle
		name, addr string
	}{{client, "h0", clientAddr}, {sandbox, "eth0", sandboxAddr}} {
		link, err := end.h.LinkByName(end.name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(end.addr)
		if err := end.h.AddrAdd(link, a); err != nil {
			t.Fatal(err)
		}
		if err := end.h.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	eth0, err := sandbox.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := sandbox.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("169.254.1.1")}); err != nil {
		t.Fatal(err)
	}
	return sandboxNS, clientNS
}

type sandbox struct {
	rt       *gvisor.Runtime
	dir      string
	spec     *sandboxrt.Spec
	clientNS string
	envd     *sandboxtest.Envd
}

// busybox holds the busybox root of each test (or benchmark), made once.
var busybox sync.Map // testing.TB → string

func newSpec(t testing.TB, dir, netNS string) *sandboxrt.Spec {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag("gvisor-test"))
	if err != nil {
		t.Fatal(err)
	}
	rootfs, ok := busybox.Load(t)
	if !ok {
		rootfs, _ = busybox.LoadOrStore(t, sandboxtest.BusyboxRootfs(t))
	}
	return &sandboxrt.Spec{
		ID:        id,
		Rootfs:    rootfs.(string),
		CPUMilli:  1000,
		MemoryMiB: 256,
		DiskMiB:   256,
		NetNS:     netNS,
		Hostname:  "sbx-" + id[:6],
		Envd:      sandboxtest.EnvdBinary(t),
		EnvdArgs:  []string{"--port", envdPort},
		Files: map[string][]byte{
			"/etc/hosts":       []byte("127.0.0.1 localhost\n" + sandboxIP + " sbx\n"),
			"/etc/resolv.conf": []byte("nameserver 192.0.2.53\n"),
		},
		Log: filepath.Join(dir, id+".log"),
	}
}

// start starts a sandbox on a busybox root and waits for its envd.
func start(t *testing.T, rt *gvisor.Runtime, dir string, edit func(*sandboxrt.Spec)) *sandbox {
	t.Helper()
	sandboxNS, clientNS := vethNetns(t)
	spec := newSpec(t, dir, sandboxNS)
	if edit != nil {
		edit(spec)
	}
	if err := rt.Start(context.Background(), spec); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Stop(context.Background(), spec.ID); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	s := &sandbox{rt: rt, dir: dir, spec: spec, clientNS: clientNS, envd: newEnvd(clientNS)}
	s.envd.WaitHealthy(t, 20*time.Second)
	return s
}

func newEnvd(clientNS string) *sandboxtest.Envd {
	return sandboxtest.NewEnvd("http://"+net.JoinHostPort(sandboxIP, envdPort), sandboxtest.NetnsDialer(clientNS))
}

func (s *sandbox) run(t *testing.T, user, script string) sandboxtest.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := s.envd.Run(ctx, user, "", script)
	if err != nil {
		t.Fatalf("run %q as %s: %v", script, user, err)
	}
	return res
}

// processes are the host processes whose command line names the sandbox
// (runsc's sandbox and gofer processes do); zombies have none.
func processes(t testing.TB, id string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupDirs are the host cgroups of the sandbox, in every hierarchy.
func cgroupDirs(t testing.TB, rt *gvisor.Runtime, id string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		p := filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(parts[1], "name="), parts[2], rt.Options().CgroupParent, id)
		if _, err := os.Stat(p); err == nil {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

func memoryCgroup(t testing.TB, rt *gvisor.Runtime, id string) string {
	t.Helper()
	for _, d := range cgroupDirs(t, rt, id) {
		if strings.HasPrefix(d, "/sys/fs/cgroup/memory/") {
			return d
		}
	}
	t.Fatalf("sandbox %s has no memory cgroup", id)
	return ""
}

func listDir(t testing.TB, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestSandboxRunsEnvdAsInitWithUsers(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, nil)
	template := listDir(t, s.spec.Rootfs)

	if got := s.run(t, "user", "id -u; id -g; pwd; hostname"); got.Stdout != "1000\n1000\n/home/user\n"+s.spec.Hostname+"\n" {
		t.Errorf("as user: %+v", got)
	}
	if got := s.run(t, "root", "id -u"); got.Stdout != "0\n" {
		t.Errorf("as root: %+v", got)
	}
	// envd is the sandbox's init, and the only processes are the sandbox's.
	got := s.run(t, "root", "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'")
	lines := strings.Split(strings.TrimSpace(got.Stdout), "\n")
	if !strings.HasPrefix(lines[0], "/usr/bin/envd --port "+envdPort) {
		t.Errorf("pid 1 = %q", got.Stdout)
	} else if n, _ := strconv.Atoi(lines[len(lines)-1]); n == 0 || n > 8 {
		t.Errorf("the sandbox sees %d processes: %q", n, got.Stdout)
	}
	// The kernel is gVisor's, and the host's processes and files are not
	// there.
	if got := s.run(t, "root", "dmesg | head -1"); !strings.Contains(got.Stdout, "gVisor") {
		t.Errorf("not gVisor's kernel: %+v", got)
	}
	if got := s.run(t, "root", "test -e /proc/"+strconv.Itoa(os.Getpid())+" && echo visible; test -e "+dir+" && echo host-dir; echo done"); got.Stdout != "done\n" {
		t.Errorf("host leaks into the sandbox: %q", got.Stdout)
	}
	// The files sandboxd gives are there, ordinary files root may change.
	if got := s.run(t, "root", "cat /etc/hosts /etc/resolv.conf; stat -c '%U %a' /etc/hosts; echo '10.0.0.1 x' >> /etc/hosts && echo appended"); got.Stdout != string(s.spec.Files["/etc/hosts"])+string(s.spec.Files["/etc/resolv.conf"])+"root 644\nappended\n" {
		t.Errorf("files: %+v", got)
	}
	// envd is read-only; the root is writable by root only, through the
	// sandbox's private layer, and the template is untouched.
	if got := s.run(t, "root", "echo x > /usr/bin/envd || echo refused"); !strings.Contains(got.Stdout, "refused") {
		t.Errorf("envd writable: %+v", got)
	}
	if got := s.run(t, "root", "echo hello > /etc/motd && cat /etc/motd && head -c 4194304 /dev/urandom > /root/big && echo wrote"); got.Stdout != "hello\nwrote\n" {
		t.Errorf("write as root: %+v", got)
	}
	if got := s.run(t, "user", "echo x > /etc/passwd || echo denied"); !strings.Contains(got.Stdout, "denied") {
		t.Errorf("user wrote /etc/passwd: %+v", got)
	}
	if got := s.run(t, "user", "echo mine > ~/f && cat ~/f"); got.Stdout != "mine\n" {
		t.Errorf("user wrote its home: %+v", got)
	}
	if after := listDir(t, s.spec.Rootfs); !slices.Equal(after, template) {
		t.Errorf("the template changed: %v, was %v", after, template)
	}
	if st, err := rt.Status(context.Background(), s.spec.ID); err != nil || st != sandboxrt.Running {
		t.Errorf("status = %v, %v", st, err)
	}
	st, err := rt.Stats(context.Background(), s.spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUUsage <= 0 || st.MemoryUsed <= 0 || st.MemoryLimit != s.spec.MemoryMiB<<20 || st.DiskLimit != s.spec.DiskMiB<<20 {
		t.Errorf("stats = %+v", st)
	}
	// The 4 MiB in /root are in the overlay's file on the host.
	if st.DiskUsed < 4<<20 || st.DiskUsed > 64<<20 {
		t.Errorf("disk used = %d, want about 4 MiB", st.DiskUsed)
	}
	// The host's cgroups of the sandbox carry its limits.
	mem := memoryCgroup(t, rt, s.spec.ID)
	// Memory and swap together as memory alone: it swaps nothing.
	for _, file := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		if limit, _ := os.ReadFile(filepath.Join(mem, file)); strings.TrimSpace(string(limit)) != strconv.FormatInt(s.spec.MemoryMiB<<20, 10) {
			t.Errorf("%s = %q", file, limit)
		}
	}
	if !strings.Contains(mem, "/"+rt.Options().CgroupParent+"/") {
		t.Errorf("the sandbox's cgroup %s is not under the runtime's parent", mem)
	}
}

// A sandbox over the memory limit is killed whole: runsc's sentry shares
// the host memory cgroup with the workload's memory, and gVisor has no OOM
// killer of its own, so the host's cgroup OOM killer ends the sentry.
func TestMemoryHogKillsTheWholeSandbox(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.MemoryMiB = 96 })
	ctx := context.Background()
	if st, err := rt.Stats(ctx, s.spec.ID); err != nil || st.MemoryLimit != 96<<20 {
		t.Fatalf("stats = %+v, %v", st, err)
	}
	if got := s.run(t, "user", "echo alive"); got.Stdout != "alive\n" {
		t.Fatalf("before: %+v", got)
	}
	// The command's connection dies with the sentry without a reset (no
	// stack is left to send one): it is cancelled once the sandbox is seen
	// dead.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		res sandboxtest.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := s.envd.Run(runCtx, "user", "", "head -c 400m /dev/zero | tail > /dev/null; echo exit=$?")
		done <- result{res, err}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case r := <-done:
			if r.err == nil {
				t.Fatalf("the hog ran to its end: %+v", r.res)
			}
			done <- r
		default:
		}
		st, err := rt.Status(ctx, s.spec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st == sandboxrt.Stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status = %v a minute after the hog started", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	// The gofer follows the sentry shortly.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		pids := processes(t, s.spec.ID)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the dead sandbox: %v", pids)
			break
		}
	}
	// Its stats still answer, with no use.
	if st, err := rt.Stats(ctx, s.spec.ID); err != nil || st.MemoryUsed != 0 {
		t.Errorf("stats of the dead sandbox = %+v, %v", st, err)
	}
}

func TestPauseCheckpointsAndResumeRestores(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, nil)
	ctx := context.Background()
	id := s.spec.ID
	s.run(t, "user", "echo in-memory > /tmp/mark; echo on-disk > ~/mark; (i=0; while :; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/tick; sleep 0.02; done) >/dev/null 2>&1 </dev/null & sleep 0.5")
	tick := func() int {
		t.Helper()
		got := s.run(t, "user", "cat /tmp/tick")
		n, err := strconv.Atoi(strings.TrimSpace(got.Stdout))
		if err != nil {
			t.Fatalf("tick: %+v", got)
		}
		return n
	}
	before := tick()
	if len(processes(t, id)) == 0 {
		t.Fatal("no host process of the sandbox found")
	}
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := rt.Status(ctx, id); err != nil || st != sandboxrt.Paused {
		t.Fatalf("status after pause = %v, %v", st, err)
	}
	// Nothing of the sandbox runs or holds memory: its processes and
	// cgroups are gone; its state is an image on disk.
	if pids := processes(t, id); len(pids) != 0 {
		t.Errorf("processes of the paused sandbox: %v", pids)
	}
	if dirs := cgroupDirs(t, rt, id); len(dirs) != 0 {
		t.Errorf("cgroups of the paused sandbox: %v", dirs)
	}
	if _, err := os.Stat(filepath.Join(dir, "gvisor", "sandboxes", id, "checkpoint", "pages.img")); err != nil {
		t.Errorf("no checkpoint image: %v", err)
	}
	st, err := rt.Stats(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryUsed != 0 || st.CPUUsage <= 0 || st.MemoryLimit != s.spec.MemoryMiB<<20 {
		t.Errorf("stats of the paused sandbox = %+v", st)
	}
	// Pausing again does nothing.
	if err := rt.Pause(ctx, id); err != nil {
		t.Errorf("second pause: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := rt.Status(ctx, id); err != nil || st != sandboxrt.Running {
		t.Fatalf("status after resume = %v, %v", st, err)
	}
	s.envd.WaitHealthy(t, 20*time.Second)
	// The loop is the same process with the same memory: its counter goes
	// on from where it was, and the files are there, /tmp's in memory.
	after := tick()
	if after < before || after > before+50 {
		t.Errorf("counter %d before the pause, %d after", before, after)
	}
	time.Sleep(300 * time.Millisecond)
	if later := tick(); later <= after {
		t.Errorf("the loop does not run after resume: %d, then %d", after, later)
	}
	if got := s.run(t, "user", "cat /tmp/mark ~/mark"); got.Stdout != "in-memory\non-disk\n" {
		t.Errorf("files after resume: %+v", got)
	}
	// The network came back as it was, default route included.
	if got := s.run(t, "root", "ip route 2>&1 || route -n"); !strings.Contains(got.Stdout, "169.254.1.1") {
		t.Errorf("routes after resume: %+v", got)
	}
	// Resuming again does nothing.
	if err := rt.Resume(ctx, id); err != nil {
		t.Errorf("second resume: %v", err)
	}
	for _, image := range []string{"checkpoint", "checkpoint.restoring", "checkpoint.tmp"} {
		if _, err := os.Stat(filepath.Join(dir, "gvisor", "sandboxes", id, image)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after resume: %v", image, err)
		}
	}
}

func TestStopRemovesEverythingAndIsIdempotent(t *testing.T) {
	rt, dir := newRuntime(t)
	running, paused := start(t, rt, dir, nil), start(t, rt, dir, nil)
	ctx := context.Background()
	if err := rt.Pause(ctx, paused.spec.ID); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*sandbox{running, paused} {
		id := s.spec.ID
		if err := rt.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Status(ctx, id); !errors.Is(err, sandboxrt.ErrNotFound) {
			t.Errorf("status after stop: %v", err)
		}
		if err := rt.Stop(ctx, id); err != nil {
			t.Errorf("second stop: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "gvisor", "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sandbox directory left: %v", err)
		}
		if dirs := cgroupDirs(t, rt, id); len(dirs) != 0 {
			t.Errorf("cgroups left: %v", dirs)
		}
		if pids := processes(t, id); len(pids) != 0 {
			t.Errorf("processes left: %v", pids)
		}
		if err := rt.Pause(ctx, id); !errors.Is(err, sandboxrt.ErrNotFound) {
			t.Errorf("pause of a stopped sandbox: %v", err)
		}
	}
	if ids, err := rt.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runtime still lists %v, %v", ids, err)
	}
}

func TestANewRuntimeFindsTheSandboxesOfTheOldOne(t *testing.T) {
	rt, dir := newRuntime(t)
	running, paused := start(t, rt, dir, nil), start(t, rt, dir, nil)
	ctx := context.Background()
	paused.run(t, "root", "echo kept > /tmp/kept")
	if err := rt.Pause(ctx, paused.spec.ID); err != nil {
		t.Fatal(err)
	}
	again, err := gvisor.New(rt.Options())
	if err != nil {
		t.Fatal(err)
	}
	if st, err := again.Status(ctx, running.spec.ID); err != nil || st != sandboxrt.Running {
		t.Errorf("status of the running one through a new runtime = %v, %v", st, err)
	}
	if st, err := again.Status(ctx, paused.spec.ID); err != nil || st != sandboxrt.Paused {
		t.Errorf("status of the paused one through a new runtime = %v, %v", st, err)
	}
	want := []string{running.spec.ID, paused.spec.ID}
	slices.Sort(want)
	if ids, err := again.List(ctx); err != nil || !slices.Equal(ids, want) {
		t.Errorf("list = %v, %v; want %v", ids, err, want)
	}
	if st, err := again.Stats(ctx, running.spec.ID); err != nil || st.MemoryUsed <= 0 {
		t.Errorf("stats through a new runtime = %+v, %v", st, err)
	}
	// As if the sandboxd before had died in Resume before runsc restore
	// ended: the image was moved aside, the sandbox is not running.
	image := filepath.Join(rt.Options().Dir, "sandboxes", paused.spec.ID, "checkpoint")
	if err := os.Rename(image, image+".restoring"); err != nil {
		t.Fatal(err)
	}
	if st, err := again.Status(ctx, paused.spec.ID); err != nil || st != sandboxrt.Paused {
		t.Errorf("status of the one being restored = %v, %v", st, err)
	}
	if err := again.Resume(ctx, paused.spec.ID); err != nil {
		t.Fatal(err)
	}
	paused.envd.WaitHealthy(t, 20*time.Second)
	// As if it had died after the restore ended: the stale image goes.
	if err := os.Mkdir(image+".restoring", 0o700); err != nil {
		t.Fatal(err)
	}
	if st, err := again.Status(ctx, paused.spec.ID); err != nil || st != sandboxrt.Running {
		t.Errorf("status of the restored one = %v, %v", st, err)
	}
	if _, err := os.Stat(image + ".restoring"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale image left: %v", err)
	}
	if got := paused.run(t, "root", "cat /tmp/kept"); got.Stdout != "kept\n" {
		t.Errorf("after resume by a new runtime: %+v", got)
	}
	if err := again.Pause(ctx, running.spec.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := rt.Status(ctx, running.spec.ID); err != nil || st != sandboxrt.Paused {
		t.Errorf("status through the old runtime = %v, %v", st, err)
	}
	if err := again.Stop(ctx, running.spec.ID); err != nil {
		t.Fatal(err)
	}
}

// The sandbox is not a child that dies with the process that started it.
func TestSandboxOutlivesTheProcessThatStartedIt(t *testing.T) {
	rt, dir := newRuntime(t)
	sandboxNS, clientNS := vethNetns(t)
	spec := newSpec(t, dir, sandboxNS)
	job, err := json.Marshal(helperJob{Opts: rt.Options(), Spec: *spec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Stop(context.Background(), spec.ID); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(job))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "started\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %q, %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	e := newEnvd(clientNS)
	e.WaitHealthy(t, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := e.Run(ctx, "user", "", "echo alive"); err != nil || res.Stdout != "alive\n" {
		t.Errorf("after its starter died: %+v, %v", res, err)
	}
	if st, err := rt.Status(ctx, spec.ID); err != nil || st != sandboxrt.Running {
		t.Errorf("status = %v, %v", st, err)
	}
}

// runsc's network stack starts on a namespace with only loopback too; envd
// is then reachable only from inside the sandbox.
func TestLoopbackOnlyNamespace(t *testing.T) {
	rt, dir := newRuntime(t)
	spec := newSpec(t, dir, sandboxtest.Netns(t))
	ctx := context.Background()
	if err := rt.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Stop(context.Background(), spec.ID); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	root := filepath.Join(rt.Options().Dir, "runsc-root")
	var last string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, err := exec.Command(runsc(t), "--root="+root, "exec", spec.ID, "/bin/wget", "-q", "-S", "-O", "-", "http://127.0.0.1:"+envdPort+"/health").CombinedOutput()
		if err == nil && strings.Contains(string(out), "204") {
			return
		}
		last = fmt.Sprintf("%s %v", out, err)
	}
	t.Errorf("envd does not answer inside the sandbox: %s", last)
}

// The sandbox's private layer holds at most DiskMiB.
func TestDiskLimit(t *testing.T) {
	rt, dir := newRuntime(t)
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.DiskMiB = 8 })
	// gVisor fails the write with EIO, not ENOSPC.
	got := s.run(t, "root", "head -c 16m /dev/zero > /root/big; echo exit=$?; wc -c < /root/big; rm /root/big; echo ok > /root/small && cat /root/small")
	lines := strings.Fields(got.Stdout)
	if len(lines) != 3 || lines[0] != "exit=1" || lines[2] != "ok" {
		t.Fatalf("writing past the disk limit: %+v", got)
	}
	if n, _ := strconv.Atoi(lines[1]); n > 8<<20 {
		t.Errorf("wrote %d bytes with a limit of 8 MiB", n)
	}
}

func TestFailedStartLeavesNothing(t *testing.T) {
	rt, dir := newRuntime(t)
	ctx := context.Background()
	spec := newSpec(t, dir, sandboxtest.Netns(t))
	missing := *spec
	missing.Rootfs = filepath.Join(dir, "no-such-template")
	if err := rt.Start(ctx, &missing); err == nil || !strings.Contains(err.Error(), "no-such-template") {
		t.Errorf("start on a template that does not exist: %v", err)
	}
	// A template where envd cannot be mounted fails in runsc, once it made
	// cgroups and started processes.
	spec.Rootfs = sandboxtest.BusyboxRootfs(t)
	if err := os.MkdirAll(filepath.Join(spec.Rootfs, "usr/bin/envd/x"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := rt.Start(ctx, spec)
	if err == nil {
		t.Fatal("started with envd's mount point a directory")
	}
	t.Log(err)
	if ids, err := rt.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("list = %v, %v", ids, err)
	}
	if dirs := cgroupDirs(t, rt, spec.ID); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if pids := processes(t, spec.ID); len(pids) != 0 {
		t.Errorf("processes left: %v", pids)
	}
	if _, err := rt.Status(ctx, spec.ID); !errors.Is(err, sandboxrt.ErrNotFound) {
		t.Errorf("status: %v", err)
	}
	// A second start of a running sandbox fails and leaves it alone.
	s := start(t, rt, dir, nil)
	if err := rt.Start(ctx, s.spec); err == nil {
		t.Error("started a sandbox twice")
	}
	if got := s.run(t, "user", "echo alive"); got.Stdout != "alive\n" {
		t.Errorf("the first sandbox after a second start: %+v", got)
	}
}

// A sandbox starts on a stack of snapshot layers whose paths pass mount(2)'s
// one page of overlay options (each layer its own fsconfig call), and sees
// the topmost layer's files over the others'.
func TestDeepLayerStack(t *testing.T) {
	rt, dir := newRuntime(t)
	const n = 120
	for _, mount2 := range []bool{false, true} {
		// On a kernel before 6.8 the layers are mounted by mount(2), in
		// one option: more than a page of them by path go by descriptor
		// (they failed before).
		t.Run(map[bool]string{false: "fsconfig", true: "mount2"}[mount2], func(t *testing.T) {
			if mount2 {
				sandboxtest.Mount2(t)
			}
			s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.Layers = envdLayers(t, n) })
			if got := s.run(t, "user", "cat /top; echo; ls / | grep -c '^layer'"); got.Stdout != fmt.Sprintf("0\n%d\n", n) {
				t.Errorf("on %d layers: %+v", n, got)
			}
		})
	}
}

// envdLayers are n snapshot layers (sandboxtest.Layers) with envd's mount
// point, which a template has, in the lowest (the layers are read-only to
// runsc's gofer, which would make it).
func envdLayers(t *testing.T, n int) []string {
	t.Helper()
	layers := sandboxtest.Layers(t, n)
	bin := filepath.Join(layers[n-1], "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "envd"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	return layers
}
