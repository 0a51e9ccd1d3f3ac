// Package hosttest runs a real sandbox host for the end-to-end tests of the
// binaries that drive one (sandbox-apiserver, vk-sandbox): sandboxd built
// from this workspace with envd beside it, the base template, and a
// directory, nftables table, cgroup, veth prefix and address pool of the
// test's own. Everything it starts or makes is gone when the test ends,
// passed or failed: the sandboxes, the daemons, the rules, the cgroups and
// the files. Tests that use it run as root (they skip otherwise) and need
// debootstrap and nft.
package hosttest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/shared/cgroups"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/spawn"
	"github.com/skiff-dev/skiff/shared/testing/forwardtest"
	"github.com/skiff-dev/skiff/shared/testing/loopback"
)

// Options describe a host.
type Options struct {
	// Name tells this test's host resources apart from other tests' (a few
	// lowercase letters): the nftables table is skiff_<name>_<random>.
	Name string
	// NodeName is sandboxd's --node-name (the tag in its sandbox IDs).
	NodeName string
	// MemoryOvercommit is sandboxd's --memory-overcommit; default 16. CPU
	// is sandboxd's default: not admitted.
	MemoryOvercommit int
	// Token is sandboxd's node token (its --auth-token-file), e.g. one
	// derived from a fleet key (shared/nodetoken); empty: a random one.
	Token string
	// Build are more binaries to build into Dir beside sandboxd and envd,
	// by package path (e.g. ".../apiserver/cmd/sandbox-apiserver"): each
	// is built with CGO_ENABLED=0, named after the path's last element,
	// and its path is in Host.Bins.
	Build []string
	// Netns, if set, is where sandboxd runs (see NewNetns): it listens on
	// the namespace's address, and its sandboxes' interfaces and rules are
	// the namespace's, as on a host of its own.
	Netns *Netns
	// LogDir, if set, is where sandboxd's log goes, as
	// <NodeName>-sandboxd.log, and stays after the test; else
	// Dir/sandboxd.log.
	LogDir string
	// SandboxdArgs are more flags of sandboxd serve.
	SandboxdArgs []string
}

// Host is one sandbox host of a test.
type Host struct {
	// Dir is the test's directory (mode 0711: sandboxes reach their root
	// through it), removed at the end.
	Dir string
	// Bins maps a binary's name (sandboxd, envd, and Options.Build's) to
	// its path in Dir.
	Bins map[string]string
	// Token is sandboxd's node token, kept in TokenFile.
	Token, TokenFile string
	// Addr is sandboxd's --listen, Admin its --admin-listen (inside the
	// host's namespace, with Options.Netns).
	Addr, Admin string
	// Client calls sandboxd with Token.
	Client sandboxdv1connect.SandboxdServiceClient
	// Sandboxd is the daemon: stop it, kill it, start it again.
	Sandboxd *Daemon
}

// NewHost builds sandboxd, envd and the other binaries, prepares the base
// template and starts sandboxd, waiting until it answers. When the test
// ends every sandbox is killed (sandboxd is started again for that if the
// test left it dead), then sandboxd stops and the host's rules, cgroups and
// files go.
func NewHost(t testing.TB, o Options) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxd runs sandboxes")
	}
	for tool, pkg := range map[string]string{"debootstrap": "debootstrap", "nft": "nftables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install %s)", tool, pkg)
		}
	}
	if o.MemoryOvercommit == 0 {
		o.MemoryOvercommit = 16
	}
	dir, err := os.MkdirTemp("", "skiff-"+o.Name+"-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%03x", rand.IntN(0xfff))
	nftTable, cgroup := "skiff_"+o.Name+"_"+suffix, "skiff-"+o.Name+"-"+suffix
	forwardtest.Keep(t)
	t.Cleanup(func() {
		// Last, after the daemons stopped (cleanups run last-registered
		// first): what sandboxd leaves for its next start.
		_ = exec.Command("nft", "delete", "table", "inet", nftTable).Run()
		if err := cgroups.Remove(cgroup); err != nil {
			t.Errorf("remove cgroup %s: %v", cgroup, err)
		}
		_ = syscall.Unmount(filepath.Join(dir, "run", "netns"), syscall.MNT_DETACH)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})

	h := &Host{Dir: dir, Bins: map[string]string{}}
	const mod = "github.com/skiff-dev/skiff/"
	h.Bins["sandboxd"] = Build(t, dir, mod+"sandboxd/cmd/sandboxd", "CGO_ENABLED=1", "GOFLAGS=-tags=seccomp")
	h.Bins["envd"] = Build(t, dir, mod+"envd/cmd/envd", "CGO_ENABLED=0")
	for _, pkg := range o.Build {
		h.Bins[filepath.Base(pkg)] = Build(t, dir, pkg, "CGO_ENABLED=0")
	}
	state := filepath.Join(dir, "state")
	if out, err := exec.Command(h.Bins["sandboxd"], "--state-dir", state, "template", "build", "base").CombinedOutput(); err != nil {
		t.Fatalf("template build base: %v\n%s", err, out)
	}
	h.Token = o.Token
	if h.Token == "" {
		h.Token = fmt.Sprintf("node-token-%016x", rand.Uint64())
	}
	h.TokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(h.TokenFile, []byte(h.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	h.Addr, h.Admin = FreeAddr(t), FreeAddr(t)
	if o.Netns != nil {
		// The namespace is the host's own: any port is free there.
		h.Addr, h.Admin = o.Netns.Addr+":27777", "127.0.0.1:27778"
	}
	h.Client = sandboxdapi.NewClients(h.Token, nil)(h.Addr)
	bin, args := h.Bins["sandboxd"], []string{"--state-dir", state, "serve",
		"--auth-token-file", h.TokenFile, "--listen", h.Addr, "--admin-listen", h.Admin, "--run-dir", filepath.Join(dir, "run"),
		"--nft-table", nftTable, "--iface-prefix", o.Name[:1] + suffix, "--cgroup-parent", cgroup, "--node-name", o.NodeName,
		"--sandbox-cidr", fmt.Sprintf("10.%d.%d.0/22", 100+rand.IntN(100), rand.IntN(64)*4), "--uid-base", fmt.Sprint(UIDBase()),
		"--memory-overcommit", fmt.Sprint(o.MemoryOvercommit)}
	args = append(args, o.SandboxdArgs...)
	if o.Netns != nil {
		bin, args = o.Netns.Command(bin, args...)
	}
	logDir, name := dir, "sandboxd"
	if o.LogDir != "" {
		logDir, name = o.LogDir, o.NodeName+"-sandboxd"
	}
	h.Sandboxd = NewDaemon(t, logDir, name, bin, args...)
	h.StartSandboxd(t)
	// Before sandboxd stops (which leaves sandboxes running, by design):
	// kill every sandbox, also when the test failed half-way.
	t.Cleanup(func() {
		if !h.Sandboxd.Running() {
			h.StartSandboxd(t)
		}
		h.KillAll(t)
	})
	return h
}

// StartSandboxd starts sandboxd and waits until it answers Info.
func (h *Host) StartSandboxd(t testing.TB) {
	t.Helper()
	h.Sandboxd.Start()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := h.Client.Info(ctx, connect.NewRequest(&pb.InfoRequest{}))
		cancel()
		if err == nil {
			return
		}
		if !h.Sandboxd.Running() {
			t.Fatal("sandboxd exited at start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("sandboxd did not answer within 60s")
}

// KillAll kills every sandbox on the host, of any team and state.
func (h *Host) KillAll(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := h.Client.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Errorf("list sandboxes to kill: %v", err)
		return
	}
	for _, sb := range resp.Msg.GetSandboxes() {
		if _, err := h.Client.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: sb.GetId()})); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("kill %s: %v", sb.GetId(), err)
		}
	}
}

// Build builds the main package pkg of this workspace into dir, named after
// the path's last element, with env added to the environment.
func Build(t testing.TB, dir, pkg string, env ...string) string {
	t.Helper()
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	return bin
}

// UIDBase returns a --uid-base for a test's sandboxd (or native runtime)
// of its own: the start of one of 700 blocks of 64 uid ranges above the
// default. Two sandbox hosts on one machine with the same base give their
// sandboxes the same host uids, and so the same kernel per-user counts
// (inotify instances, pending signals): tests running side by side then
// saw each other's sandboxes' use.
func UIDBase() uint32 {
	return 1_000_000_000 + uint32(rand.IntN(700))*64*65536
}

// FreeAddr returns a loopback address with a port free a moment ago, and
// not handed out before in this process (loopback.FreeAddr).
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// Daemon is a process a test starts, stops and kills, in a session of its
// own, its output appended to <dir>/<name>.log (the last 64 KiB of which
// the test logs when it fails). It is stopped when the test ends.
type Daemon struct {
	t    testing.TB
	name string
	bin  string
	// Args are the arguments of the next Start.
	Args []string
	// Log is the log file's path.
	Log string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// NewDaemon returns the daemon, not started.
func NewDaemon(t testing.TB, dir, name, bin string, args ...string) *Daemon {
	d := &Daemon{t: t, name: name, bin: bin, Args: args, Log: filepath.Join(dir, name+".log")}
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			data, _ := os.ReadFile(d.Log)
			if len(data) > 64<<10 {
				data = data[len(data)-64<<10:]
			}
			t.Logf("%s (last 64 KiB):\n%s", filepath.Base(d.Log), data)
		}
	})
	return d
}

// Start runs the daemon.
func (d *Daemon) Start() {
	d.t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		d.t.Fatalf("%s is already running", d.name)
	}
	logf, err := os.OpenFile(d.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(d.bin, d.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session; killed with the test binary even when that ends
	// without its cleanups (a panic, go test's -timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := spawn.Start(cmd, syscall.SIGKILL); err != nil {
		d.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited
}

// Running reports whether the daemon runs.
func (d *Daemon) Running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig and waits for the daemon to exit (killing it after 30s).
func (d *Daemon) Signal(sig syscall.Signal) {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		d.t.Errorf("%s did not exit within 30s of %v", d.name, sig)
	}
}

// Stop ends the daemon with SIGTERM.
func (d *Daemon) Stop() { d.Signal(syscall.SIGTERM) }

// Kill9 ends the daemon at once, as a crash would.
func (d *Daemon) Kill9() { d.Signal(syscall.SIGKILL) }

// Metric reads one unlabelled sample, as text, from the /metrics of the
// admin listener at admin (host:port); "" when it is not there or the
// listener does not answer.
func Metric(admin, name string) string {
	page, err := MetricsPage(admin)
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// MetricsPage is the /metrics page of the admin listener at admin
// (host:port).
func MetricsPage(admin string) (string, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/metrics: %s", admin, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
