// Package e2e runs sandboxd as its own process, as on a host — this test
// binary re-executed as `sandboxd serve` — and drives it through its Connect
// API and relay with real sandboxes, including kill -9 of the daemon.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/cli"
	"github.com/skiff-dev/skiff/sandboxd/internal/network"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/spawn"
	"github.com/skiff-dev/skiff/shared/testing/forwardtest"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/wire"
)

const asSandboxd = "SKIFF_E2E_AS_SANDBOXD"

func init() {
	if os.Getenv(asSandboxd) == "1" {
		cmd := cli.NewCommand()
		cmd.SetArgs(os.Args[1:])
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		err := cmd.ExecuteContext(ctx)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// host is one sandbox host: a state directory and the sandboxd serving it,
// which a test may kill and start again.
type host struct {
	t       testing.TB
	state   string
	args    []string
	listen  string
	admin   string
	token   string
	log     string
	proc    *exec.Cmd
	exited  chan struct{} // closed when sandboxd has exited
	exitErr error         // then: how it ended
	// cleanedUp: cleanup already ran (a benchmark that measured it).
	cleanedUp bool
	// served: sandboxd became healthy at least once, so cleanup may start
	// it again to kill the sandboxes.
	served  bool
	api     sandboxdv1connect.SandboxdServiceClient
	netOpts network.Options
	// cgroupParent holds the sandboxes' cgroups, below this process's.
	cgroupParent string
	template     string
}

// newHost prepares a host with the busybox template and starts sandboxd.
func newHost(t testing.TB, extra ...string) *host {
	t.Helper()
	return newHostWith(t, func(lib *template.Library) (*template.Template, error) {
		return lib.ImportDir("busybox", sandboxtest.BusyboxRootfs(t))
	}, extra...)
}

// baseHost prepares a host with the base template (built by debootstrap,
// cached) on runtime rt, native or gvisor, and starts sandboxd with extra.
func baseHost(t *testing.T, rt string, extra ...string) *host {
	t.Helper()
	if rt == "gvisor" {
		extra = append(extra, "--runtime", "gvisor", "--runsc", os.Getenv("SKIFF_RUNSC"))
	}
	return newHostWith(t, func(lib *template.Library) (*template.Template, error) {
		return lib.BuildBase(context.Background(), template.BaseOptions{Progress: io.Discard})
	}, extra...)
}

// newHostWith prepares a host with the template addTemplate puts in its
// library and starts sandboxd.
func newHostWith(t testing.TB, addTemplate func(*template.Library) (*template.Template, error), extra ...string) *host {
	t.Helper()
	sandboxtest.RequireRoot(t)
	dir := sandboxtest.Dir(t)
	h := &host{t: t, state: filepath.Join(dir, "state"), log: filepath.Join(dir, "sandboxd.log")}
	lib, err := template.OpenLibrary(filepath.Join(h.state, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := addTemplate(lib)
	if err != nil {
		t.Fatal(err)
	}
	h.template = tmpl.Name
	h.token = fmt.Sprintf("e2e-token-%016x", rand.Uint64())
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(h.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.listen, h.admin = hosttest.FreeAddr(t), hosttest.FreeAddr(t)
	h.cgroupParent = sandboxtest.CgroupParent(t)
	suffix := fmt.Sprintf("%03x", rand.IntN(0xfff))
	// A /21: 512 sandboxes' /30s, more than any test asks for.
	pool := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/21", 100+rand.IntN(100), rand.IntN(32)*8))
	h.netOpts = network.Options{RunDir: filepath.Join(dir, "run"), Table: "skiff_e2e_" + suffix, IfacePrefix: "e2" + suffix, Pool: pool}
	h.args = append([]string{
		"serve", "--state-dir", h.state, "--run-dir", h.netOpts.RunDir,
		"--listen", h.listen, "--admin-listen", h.admin, "--auth-token-file", tokenFile,
		"--node-name", "e2e-" + suffix, "--sandbox-cidr", pool.String(), "--max-sandboxes", "32",
		"--iface-prefix", h.netOpts.IfacePrefix, "--nft-table", h.netOpts.Table,
		"--cgroup-parent", h.cgroupParent, "--envd", sandboxtest.EnvdBinary(t),
		"--envd-ready-timeout", "20s", "--memory-overcommit", "32", "--uid-base", strconv.FormatUint(uint64(hosttest.UIDBase()), 10),
	}, extra...)
	forwardtest.Keep(t)
	h.api = sandboxdv1connect.NewSandboxdServiceClient(http.DefaultClient, "http://"+h.listen,
		connect.WithInterceptors(bearer(h.token)))
	t.Cleanup(func() {
		h.cleanup()
	})
	h.start()
	return h
}

// start runs sandboxd and waits until its admin port says it is healthy
// (which it does once it has re-adopted the sandboxes it found). If a port
// it was given was taken meanwhile by someone else, it tries new ones.
func (h *host) start() {
	h.t.Helper()
	for attempt := 0; ; attempt++ {
		if h.tryStart() {
			return
		}
		if attempt == 2 || !strings.Contains(h.logTail(), "address already in use") {
			h.t.Fatalf("sandboxd exited: %v\n%s", h.exitErr, h.logTail())
		}
		h.listen, h.admin = hosttest.FreeAddr(h.t), hosttest.FreeAddr(h.t)
		h.setArg("--listen", h.listen)
		h.setArg("--admin-listen", h.admin)
		h.api = sandboxdv1connect.NewSandboxdServiceClient(http.DefaultClient, "http://"+h.listen, connect.WithInterceptors(bearer(h.token)))
	}
}

func (h *host) setArg(flag, value string) {
	for i := range h.args[:len(h.args)-1] {
		if h.args[i] == flag {
			h.args[i+1] = value
		}
	}
}

// tryStart runs sandboxd; false if it exited before it was healthy.
func (h *host) tryStart() bool {
	h.t.Helper()
	logf, err := os.OpenFile(h.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		h.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("/proc/self/exe", h.args...)
	cmd.Env = append(os.Environ(), asSandboxd+"=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session, so it is the daemon, not part of the test's group;
	// killed with the test binary even when that ends without its
	// cleanups (a panic, go test's -timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := spawn.Start(cmd, syscall.SIGKILL); err != nil {
		h.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		h.exitErr = cmd.Wait()
		close(exited)
	}()
	h.proc, h.exited = cmd, exited
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			h.proc = nil
			return false
		default:
		}
		resp, err := http.Get("http://" + h.admin + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				h.served = true
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("sandboxd not healthy within 30s\n%s", h.logTail())
	return false
}

// killAll kills every sandbox through the API.
func (h *host) killAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	list, err := h.api.List(ctx, connect.NewRequest(&sandboxdv1.ListRequest{}))
	if err != nil {
		h.t.Errorf("list: %v", err)
		return
	}
	for _, sb := range list.Msg.GetSandboxes() {
		if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: sb.GetId()})); err != nil {
			h.t.Errorf("kill %s: %v", sb.GetId(), err)
		}
	}
}

// kill9 kills sandboxd at once, as a crash would.
func (h *host) kill9() {
	h.t.Helper()
	if err := syscall.Kill(h.proc.Process.Pid, syscall.SIGKILL); err != nil {
		h.t.Fatal(err)
	}
	<-h.exited
	h.proc = nil
}

// stop ends sandboxd cleanly (SIGTERM).
func (h *host) stop() {
	h.t.Helper()
	if h.proc == nil {
		return
	}
	_ = syscall.Kill(h.proc.Process.Pid, syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(h.proc.Process.Pid, syscall.SIGKILL)
		<-h.exited
		h.t.Error("sandboxd did not stop on SIGTERM within 20s")
	}
	h.proc = nil
}

// cleanup kills every sandbox through the API (starting sandboxd if a test
// left it dead), stops sandboxd and removes its network rules.
func (h *host) cleanup() {
	if h.cleanedUp {
		return
	}
	h.cleanedUp = true
	if h.served {
		if h.proc == nil {
			h.start()
		}
		h.killAll()
	}
	h.stop()
	// Volumes' images stay mounted for the host's next sandboxd, as on a
	// host: here there is none.
	mounts, _ := filepath.Glob(filepath.Join(h.netOpts.RunDir, "volumes", "*"))
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nm, err := network.New(h.netOpts)
	if err == nil {
		err = nm.Remove(ctx)
		_ = nm.Close()
	}
	if err != nil {
		h.t.Errorf("remove the network rules: %v", err)
	}
	if h.t.Failed() {
		h.t.Logf("sandboxd log:\n%s", h.logTail())
	}
}

func (h *host) logTail() string {
	data, _ := os.ReadFile(h.log)
	if len(data) > 8000 {
		data = data[len(data)-8000:]
	}
	return string(data)
}

// create starts a sandbox from the host's template.
func (h *host) create(edit func(*sandboxdv1.CreateRequest)) *sandboxdv1.CreateResponse {
	h.t.Helper()
	req := &sandboxdv1.CreateRequest{
		Template: h.template, Team: "team-a", Timeout: durationpb.New(5 * time.Minute),
		Resources: &sandboxdv1.Resources{CpuMilli: 1000, MemoryMib: 256},
	}
	if edit != nil {
		edit(req)
	}
	resp, err := h.api.Create(context.Background(), connect.NewRequest(req))
	if err != nil {
		h.t.Fatalf("create: %v\n%s", err, h.logTail())
	}
	return resp.Msg
}

// envd is a client of a sandbox's envd through sandboxd's relay.
func (h *host) envd(id string) *sandboxtest.Envd {
	hc := &http.Client{Transport: relayHeaders{id: id, token: h.token, next: &http.Transport{DisableKeepAlives: true}}}
	return sandboxtest.NewEnvdWithClient("http://"+h.listen, hc)
}

// run runs a script in a sandbox as user through the relay.
func (h *host) run(id, token, user, script string) (sandboxtest.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return h.envd(id).Run(ctx, user, token, script)
}

func (h *host) mustRun(id, token, user, script string) sandboxtest.Result {
	h.t.Helper()
	res, err := h.run(id, token, user, script)
	if err != nil {
		h.t.Fatalf("run %q in %s: %v", script, id, err)
	}
	return res
}

type relayHeaders struct {
	id, token string
	next      http.RoundTripper
}

func (r relayHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("E2b-Sandbox-Id", r.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set(wire.NodeTokenHeader, r.token)
	return r.next.RoundTrip(req)
}

func bearer(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}
}

// containersDir is where the native runtime keeps libcontainer's state of
// each sandbox: under --run-dir.
func (h *host) containersDir() string {
	return filepath.Join(h.netOpts.RunDir, native.Name, "containers")
}

// containerDir is libcontainer's state of sandbox id.
func (h *host) containerDir(id string) string { return filepath.Join(h.containersDir(), id) }

// initPid is the host pid of a sandbox's init (envd), from the native
// runtime's state.
func (h *host) initPid(id string) int {
	h.t.Helper()
	data, err := os.ReadFile(filepath.Join(h.containerDir(id), "state.json"))
	if err != nil {
		h.t.Fatal(err)
	}
	const key = `"init_process_pid":`
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		h.t.Fatalf("no init pid in the state of %s", id)
	}
	rest := data[i+len(key):]
	end := bytes.IndexAny(rest, ",}")
	pid, err := strconv.Atoi(strings.TrimSpace(string(rest[:end])))
	if err != nil {
		h.t.Fatal(err)
	}
	return pid
}

func code(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}
