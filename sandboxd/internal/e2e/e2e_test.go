package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func TestCreateRunKill(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	created := h.create(func(r *sandboxdv1.CreateRequest) {
		r.EnvVars = map[string]string{"GREETING": "ahoy"}
		r.Metadata = map[string]string{"purpose": "e2e"}
	})
	sb, token := created.GetSandbox(), created.GetEnvdAccessToken()
	if !sandboxid.Valid(sb.GetId()) || token == "" || sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("created %+v (token %q)", sb, token)
	}
	// A command runs as user `user`, with the env vars given at create.
	if got := h.mustRun(sb.GetId(), token, "user", "id -u; echo $HOME; echo $GREETING"); got.Stdout != "1000\n/home/user\nahoy\n" {
		t.Errorf("command as user: %+v", got)
	}
	// e2b's files naming the sandbox, for processes envd did not start.
	if got := h.mustRun(sb.GetId(), token, "user", "cat /run/e2b/.E2B_SANDBOX_ID; echo; cat /run/e2b/.E2B_SANDBOX; echo; stat -c %U /run/e2b"); got.Stdout != sb.GetId()+"\ntrue\nroot\n" {
		t.Errorf("/run/e2b: %+v", got)
	}
	// envd refuses a request without the sandbox's token.
	if _, err := h.run(sb.GetId(), "", "user", "true"); code(err) != connect.CodeUnauthenticated {
		t.Errorf("without the access token: %v", err)
	}
	// The relay refuses envd's internal routes.
	req, _ := http.NewRequest(http.MethodPost, "http://"+h.listen+"/init", strings.NewReader("{}"))
	resp, err := relayHeaders{id: sb.GetId(), token: h.token, next: http.DefaultTransport}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/init through the relay: %d", resp.StatusCode)
	}
	// The command's output is in the sandbox's log; the token is not.
	logs, err := h.api.Logs(ctx, connect.NewRequest(&sandboxdv1.LogsRequest{SandboxId: sb.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	var sawOutput bool
	for _, l := range logs.Msg.GetLogs() {
		sawOutput = sawOutput || (l.GetSource() == "stdout" && l.GetLine() == "ahoy")
		if strings.Contains(l.GetLine(), token) {
			t.Errorf("the access token is in the log: %q", l.GetLine())
		}
	}
	if !sawOutput {
		t.Errorf("no stdout line \"ahoy\" in %d log lines", len(logs.Msg.GetLogs()))
	}
	metrics, err := h.api.Metrics(ctx, connect.NewRequest(&sandboxdv1.MetricsRequest{SandboxId: sb.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	if ms := metrics.Msg.GetMetrics(); len(ms) == 0 || ms[len(ms)-1].GetMemTotal() != 256<<20 || ms[len(ms)-1].GetMemUsed() <= 0 || ms[len(ms)-1].GetCpuCount() != 1 {
		t.Errorf("metrics: %v", ms)
	}
	info, err := h.api.Info(ctx, connect.NewRequest(&sandboxdv1.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if i := info.Msg; i.GetSandboxes() != 1 || i.GetRuntime() != "native" || i.GetAllocated().GetMemoryMib() != 256 || len(i.GetTemplates()) != 1 || i.GetTag() != sb.GetId()[16:] {
		t.Errorf("info: %v", i)
	}
	got, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: sb.GetId()}))
	if err != nil || got.Msg.GetSandbox().GetMetadata()["purpose"] != "e2e" || got.Msg.GetSandbox().GetTeam() != "team-a" || got.Msg.GetEnvdAccessToken() != token {
		t.Errorf("get: %+v, %v", got, err)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: sb.GetId()})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: sb.GetId()})); code(err) != connect.CodeNotFound {
		t.Errorf("get after kill: %v", err)
	}
	// Its traffic now gets e2b's 502, and nothing of it is left.
	if _, err := h.run(sb.GetId(), token, "user", "true"); err == nil || !strings.Contains(err.Error(), "502") {
		t.Errorf("run after kill: %v", err)
	}
	for _, p := range []string{
		filepath.Join(h.netOpts.RunDir, "netns", sb.GetId()),
		filepath.Join(h.state, "native", "sandboxes", sb.GetId()),
		h.containerDir(sb.GetId()),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after kill: %v", p, err)
		}
	}
}

func TestIsolation(t *testing.T) {
	h := newHost(t)
	a := h.create(nil)
	b := h.create(func(r *sandboxdv1.CreateRequest) { r.AllowInternetAccess = new(false) })
	ida, idb := a.GetSandbox().GetId(), b.GetSandbox().GetId()
	addrB := strings.TrimSpace(h.mustRun(idb, b.GetEnvdAccessToken(), "user", "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1").Stdout)
	gwA := strings.TrimSpace(h.mustRun(ida, a.GetEnvdAccessToken(), "user", "ip route | awk '/default/ {print $3}'").Stdout)
	if addrB == "" || gwA == "" {
		t.Fatalf("addresses: b=%q gateway of a=%q", addrB, gwA)
	}
	_, adminPort, _ := strings.Cut(h.admin, ":")
	_, apiPort, _ := strings.Cut(h.listen, ":")
	// probe connects from a sandbox with busybox's nc (which has no -z):
	// "reached" when the connect succeeds, else nc's error (refused,
	// unreachable, or timed out where packets are dropped).
	probe := func(id, tok, host, port string) string {
		out := h.mustRun(id, tok, "user", "timeout 3 nc -w 1 "+host+" "+port+" </dev/null 2>&1 && echo reached").Stdout
		return strings.TrimSpace(out)
	}
	// The probe can tell: a sandbox reaches its own envd.
	if got := probe(ida, a.GetEnvdAccessToken(), "127.0.0.1", "49983"); got != "reached" {
		t.Fatalf("sandbox a's own envd: %q", got)
	}
	for _, target := range []string{
		addrB + ":49983", // another sandbox's envd
		gwA + ":" + apiPort,
		gwA + ":" + adminPort, // sandboxd's ports on the host (bound to loopback, and on every address for the API in production)
		gwA + ":22",
	} {
		host, port, _ := strings.Cut(target, ":")
		if got := probe(ida, a.GetEnvdAccessToken(), host, port); strings.Contains(got, "reached") {
			t.Errorf("sandbox a reached %s: %q", target, got)
		}
	}
	// Without internet access nothing out is reached (what the rules do
	// to each kind of address: TestEgressRules and network's tests).
	if got := probe(idb, b.GetEnvdAccessToken(), "192.0.2.1", "80"); strings.Contains(got, "reached") {
		t.Errorf("sandbox without internet access: %q", got)
	}
	// The sandbox sees none of the host's processes or files.
	if got := h.mustRun(ida, a.GetEnvdAccessToken(), "root", "ls /proc | grep -c '^[0-9]'; test -e "+h.state+" && echo state-visible; true"); strings.Contains(got.Stdout, "visible") {
		t.Errorf("host visible: %+v", got)
	}
}

func TestPauseResumeAndDeadlines(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	c := h.create(nil)
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	h.mustRun(id, token, "user", "echo before > /tmp/state")
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); code(err) != connect.CodeFailedPrecondition {
		t.Errorf("second pause: %v", err)
	}
	if _, err := h.run(id, token, "user", "true"); err == nil {
		t.Error("a paused sandbox answered")
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if got := h.mustRun(id, token, "user", "cat /tmp/state"); got.Stdout != "before\n" {
		t.Errorf("after resume: %+v", got)
	}
	// SetTimeout moves the deadline; at the deadline the sandbox is killed.
	if _, err := h.api.SetTimeout(ctx, connect.NewRequest(&sandboxdv1.SetTimeoutRequest{SandboxId: id, Timeout: durationpb.New(time.Second)})); err != nil {
		t.Fatal(err)
	}
	// With auto-pause it is paused instead.
	ap := h.create(func(r *sandboxdv1.CreateRequest) { r.AutoPause = true; r.Timeout = durationpb.New(time.Second) })
	waitFor(t, 15*time.Second, "the deadline to kill the sandbox", func() bool {
		_, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
		return code(err) == connect.CodeNotFound
	})
	waitFor(t, 15*time.Second, "the deadline to pause the auto-pause sandbox", func() bool {
		got, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: ap.GetSandbox().GetId()}))
		return err == nil && got.Msg.GetSandbox().GetState() == sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED
	})
}

func TestWarmAndConcurrentClaims(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	const warm, claims = 10, 100
	var wg sync.WaitGroup
	errs := make(chan error, claims)
	for range warm {
		wg.Go(func() {
			if _, err := h.api.Warm(ctx, connect.NewRequest(&sandboxdv1.WarmRequest{Template: h.template, Pool: "ns/pool", Resources: &sandboxdv1.Resources{CpuMilli: 500, MemoryMib: 128}})); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("warm: %v", err)
	}
	type won struct{ id, token string }
	wins := make(chan won, claims)
	failures := make(chan error, claims)
	for range claims {
		wg.Go(func() {
			resp, err := h.api.Claim(ctx, connect.NewRequest(&sandboxdv1.ClaimRequest{Pool: "ns/pool", Team: "team-b", Timeout: durationpb.New(time.Minute)}))
			if err != nil {
				failures <- err
				return
			}
			wins <- won{resp.Msg.GetSandbox().GetId(), resp.Msg.GetEnvdAccessToken()}
		})
	}
	wg.Wait()
	close(wins)
	close(failures)
	seen := map[string]bool{}
	for w := range wins {
		if seen[w.id] {
			t.Errorf("%s claimed twice", w.id)
		}
		seen[w.id] = true
		if got := h.mustRun(w.id, w.token, "user", "echo mine"); got.Stdout != "mine\n" {
			t.Errorf("claimed %s: %+v", w.id, got)
		}
	}
	if len(seen) != warm {
		t.Errorf("%d claims won, want %d", len(seen), warm)
	}
	for err := range failures {
		if c := code(err); c != connect.CodeNotFound && c != connect.CodeFailedPrecondition {
			t.Errorf("a losing claim: %v", err)
		}
	}
}

func TestBadRequests(t *testing.T) {
	h := newHost(t, "--max-sandboxes", "1")
	ctx := context.Background()
	for name, req := range map[string]*sandboxdv1.CreateRequest{
		"template": {Template: "no-such-template", Timeout: durationpb.New(time.Minute)},
		"timeout":  {Template: h.template},
		"metadata": {Template: h.template, Timeout: durationpb.New(time.Minute), Metadata: map[string]string{strings.Repeat("k", 65): "v"}},
	} {
		_, err := h.api.Create(ctx, connect.NewRequest(req))
		if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	h.create(nil)
	if _, err := h.api.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{Template: h.template, Timeout: durationpb.New(time.Minute)})); code(err) != connect.CodeResourceExhausted {
		t.Errorf("over --max-sandboxes: %v", err)
	}
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: "aaaaaaaaaaaaaaaaaaaa"})); code(err) != connect.CodeNotFound {
		t.Errorf("unknown sandbox: %v", err)
	}
	// Without the node token nothing is served.
	resp, err := http.Post("http://"+h.listen+"/skiff.sandboxd.v1.SandboxdService/List", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the node token: %d", resp.StatusCode)
	}
}

func TestKill9KeepsEverySandbox(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	running := h.create(func(r *sandboxdv1.CreateRequest) { r.Metadata = map[string]string{"keep": "me"} })
	paused := h.create(nil)
	doomed := h.create(nil)
	idR, idP, idD := running.GetSandbox().GetId(), paused.GetSandbox().GetId(), doomed.GetSandbox().GetId()
	h.mustRun(idR, running.GetEnvdAccessToken(), "user", "echo kept > /tmp/file")
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: idP})); err != nil {
		t.Fatal(err)
	}
	before, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: idR}))
	if err != nil {
		t.Fatal(err)
	}
	pidR, pidD := h.initPid(idR), h.initPid(idD)

	h.kill9()
	// The sandboxes are not sandboxd's children: they live on.
	if err := syscall.Kill(pidR, 0); err != nil {
		t.Fatalf("the running sandbox died with sandboxd: %v", err)
	}
	// One dies while sandboxd is down.
	if err := syscall.Kill(pidD, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the doomed sandbox to die", func() bool { return syscall.Kill(pidD, 0) != nil })
	h.start()

	after, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: idR}))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := after.Msg.GetSandbox(), before.Msg.GetSandbox(); !a.GetEndAt().AsTime().Equal(b.GetEndAt().AsTime()) || a.GetMetadata()["keep"] != "me" || a.GetState() != b.GetState() {
		t.Errorf("re-adopted as %+v, was %+v", a, b)
	}
	// Its traffic works again, with the same token, and its files are there.
	if got := h.mustRun(idR, running.GetEnvdAccessToken(), "user", "cat /tmp/file"); got.Stdout != "kept\n" {
		t.Errorf("after restart: %+v", got)
	}
	p, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: idP}))
	if err != nil || p.Msg.GetSandbox().GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("paused sandbox after restart: %+v, %v", p, err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: idP})); err != nil {
		t.Fatal(err)
	}
	if got := h.mustRun(idP, paused.GetEnvdAccessToken(), "user", "echo back"); got.Stdout != "back\n" {
		t.Errorf("resumed after restart: %+v", got)
	}
	// The dead one is reported gone and cleaned up.
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: idD})); code(err) != connect.CodeNotFound {
		t.Errorf("the dead sandbox: %v", err)
	}
	for _, p := range []string{
		filepath.Join(h.netOpts.RunDir, "netns", idD),
		filepath.Join(h.state, "native", "sandboxes", idD),
		h.containerDir(idD),
		filepath.Join("/sys/fs/cgroup/pids", ownCgroup(t, "pids"), h.cgroupParent, idD),
		filepath.Join("/sys/fs/cgroup/memory", ownCgroup(t, "memory"), h.cgroupParent, idD),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the dead sandbox was cleaned up: %v", p, err)
		}
	}
	// The same paths exist for a live sandbox: the checks above look where
	// things would be.
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", ownCgroup(t, "memory"), h.cgroupParent, idR)); err != nil {
		t.Errorf("the live sandbox's memory cgroup: %v", err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), idD) {
		t.Errorf("a mount of the dead sandbox is left")
	}
	// A clean stop leaves sandboxes running too.
	h.stop()
	if err := syscall.Kill(pidR, 0); err != nil {
		t.Errorf("SIGTERM of sandboxd killed a sandbox: %v", err)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBaseTemplate runs what the e2b SDK runs by default: the built-in base
// template (Debian from debootstrap, cached in ~/.cache/skiff/debootstrap),
// commands through `bash -l -c` as user.
func TestBaseTemplate(t *testing.T) {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Fatal("the base template needs debootstrap (apt-get install debootstrap)")
	}
	for _, rt := range []string{"native", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			h := baseHost(t, rt)
			c := h.create(nil)
			// user's sudo makes it root of the sandbox, without a password,
			// and root there holds no more than before.
			got := h.mustRun(c.GetSandbox().GetId(), c.GetEnvdAccessToken(), "user",
				`exec bash -l -c 'whoami; pwd; python3 -c "print(6*7)"; python -c "print(7*7)"; git --version >/dev/null && curl --version >/dev/null && echo tools; pip --version >/dev/null && pip install --dry-run --no-index nothing-here 2>&1 | grep -c externally-managed; sudo -n whoami; sudo -n sh -c "echo ok > /etc/by-sudo" && cat /etc/by-sudo; getent hosts localhost >/dev/null && echo hosts'`)
			if got.Stdout != "user\n/home/user\n42\n49\ntools\n0\nroot\nok\nhosts\n" || got.ExitCode != 0 {
				t.Errorf("in the base template: %+v", got)
			}
		})
	}
}

// TestGvisorRuntime runs the same daemon with --runtime gvisor: a command as
// user under gVisor's kernel, a pause that checkpoints the sandbox to disk
// and a resume that restores its memory, then kill.
func TestGvisorRuntime(t *testing.T) {
	runsc := os.Getenv("SKIFF_RUNSC")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
	}
	h := newHost(t, "--runtime", "gvisor", "--runsc", runsc)
	ctx := context.Background()
	c := h.create(nil)
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	if got := h.mustRun(id, token, "user", "id -u; dmesg 2>/dev/null | grep -c gVisor; echo kept > /tmp/mem"); !strings.HasPrefix(got.Stdout, "1000\n") || strings.HasPrefix(got.Stdout, "1000\n0\n") {
		t.Errorf("under gVisor: %+v", got)
	}
	if got := h.mustRun(id, token, "user", "cat /run/e2b/.E2B_SANDBOX_ID"); got.Stdout != id {
		t.Errorf("/run/e2b/.E2B_SANDBOX_ID under gVisor: %+v", got)
	}
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if got := h.mustRun(id, token, "user", "cat /tmp/mem"); got.Stdout != "kept\n" {
		t.Errorf("after checkpoint and restore: %+v", got)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.state, "gvisor", "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox's bundle is left: %v", err)
	}
}

// ownCgroup is this process's cgroup in a v1 hierarchy ("/" if none).
func ownCgroup(t *testing.T, hierarchy string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), hierarchy) {
			return parts[2]
		}
	}
	return "/"
}
