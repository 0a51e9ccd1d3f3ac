package e2e

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// changes collects the Watch stream's changes until the test ends.
type changes struct {
	mu     sync.Mutex
	synced bool // the snapshot came
	seen   []*sandboxdv1.WatchResponse_Change
}

func (h *host) watchChanges(t *testing.T) *changes {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// The API client's interceptor signs unary calls only.
	req := connect.NewRequest(&sandboxdv1.WatchRequest{})
	req.Header().Set("Authorization", "Bearer "+h.token)
	stream, err := h.api.Watch(ctx, req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &changes{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for stream.Receive() {
			if stream.Msg().GetSnapshot() != nil {
				c.mu.Lock()
				c.synced = true
				c.mu.Unlock()
			}
			if ch := stream.Msg().GetChange(); ch != nil {
				c.mu.Lock()
				c.seen = append(c.seen, ch)
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		synced := c.synced
		c.mu.Unlock()
		if synced {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("no Watch snapshot within 10 s")
		}
	}
}

// deleted waits for the Watch delete of sandbox id and returns it.
func (c *changes) deleted(t *testing.T, id string) *sandboxdv1.WatchResponse_Change {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, ch := range c.seen {
			if ch.GetType() == sandboxdv1.WatchResponse_CHANGE_TYPE_DELETED && ch.GetSandbox().GetId() == id {
				c.mu.Unlock()
				return ch
			}
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no Watch delete of %s within 15 s", id)
	return nil
}

// A sandbox whose envd (its init) dies is seen to die at once: it leaves
// the registry, frees its capacity, and its Watch delete (which the
// inventory, the e2b API and kubectl follow) says why. Before, it stayed
// "running" until its deadline. This holds for a sandbox the running
// sandboxd started (whose exit status it reaps) and for one it adopted
// after its own restart.
func TestASandboxThatDiesIsSeenToDie(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	watch := h.watchChanges(t)
	started := h.create(nil).GetSandbox().GetId()
	adopted := h.create(nil).GetSandbox().GetId()

	if err := syscall.Kill(h.initPid(started), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ch := watch.deleted(t, started)
	if !strings.Contains(ch.GetEnded(), "killed by signal 9") {
		t.Errorf("the delete of a sandbox whose envd was killed says %q", ch.GetEnded())
	}
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: started})); code(err) != connect.CodeNotFound {
		t.Errorf("get of the dead sandbox: %v", err)
	}
	info, err := h.api.Info(ctx, connect.NewRequest(&sandboxdv1.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Msg; got.GetSandboxes() != 1 || got.GetAllocated().GetMemoryMib() != 256 {
		t.Errorf("after one of two sandboxes died: %d sandboxes, %d MiB allocated", got.GetSandboxes(), got.GetAllocated().GetMemoryMib())
	}
	if log := h.logTail(); !strings.Contains(log, "sandbox ended by itself") || !strings.Contains(log, started) {
		t.Errorf("sandboxd's log does not say the sandbox died:\n%s", log)
	}
	if m := h.metrics(t); !strings.Contains(m, `skiff_sandboxd_kills_total{reason="died",result="ok"} 1`) {
		t.Errorf("no died kill in the metrics")
	}

	// After a restart, the adopted sandbox is watched too; its exit
	// status is the host's init's to reap, so the delete only says it
	// exited.
	h.kill9()
	h.start()
	watch = h.watchChanges(t)
	if err := syscall.Kill(h.initPid(adopted), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if ch := watch.deleted(t, adopted); !strings.Contains(ch.GetEnded(), "envd (its init) exited") {
		t.Errorf("the delete of an adopted sandbox that died says %q", ch.GetEnded())
	}
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: adopted})); code(err) != connect.CodeNotFound {
		t.Errorf("get of the dead adopted sandbox: %v", err)
	}
}

// metrics is sandboxd's /metrics page.
func (h *host) metrics(t *testing.T) string {
	t.Helper()
	page, err := hosttest.MetricsPage(h.admin)
	if err != nil {
		t.Fatal(err)
	}
	return page
}

// Under gVisor a sandbox whose memory passes its limit dies whole (gVisor
// has no OOM killer of its own), and it is seen to die; a pause (which
// ends runsc's process, to disk) and a resume are not mistaken for a
// death. runsc's process is not sandboxd's child, and gVisor's end leaves
// no OOM kill in the cgroup, so the delete says only that envd exited.
func TestAGvisorSandboxThatDiesIsSeenToDie(t *testing.T) {
	runsc := os.Getenv("SKIFF_RUNSC")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
	}
	h := newHostWith(t, func(lib *template.Library) (*template.Template, error) {
		rootfs := sandboxtest.BusyboxRootfs(t)
		sandboxtest.InstallHog(t, rootfs)
		return lib.ImportDir("busybox", rootfs)
	}, "--runtime", "gvisor", "--runsc", runsc)
	ctx := context.Background()
	watch := h.watchChanges(t)
	c := h.create(func(r *sandboxdv1.CreateRequest) { r.Resources = &sandboxdv1.Resources{CpuMilli: 1000, MemoryMib: 256} })
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if got := h.mustRun(id, token, "user", "echo alive"); got.Stdout != "alive\n" {
		t.Fatalf("after pause and resume: %+v", got)
	}
	_, _ = h.run(id, token, "user", "hog mem 1024") // it dies with the sandbox
	ch := watch.deleted(t, id)
	if !strings.Contains(ch.GetEnded(), "the sandbox died: envd (its init) exited") {
		t.Errorf("the delete of a gVisor sandbox that passed its memory limit says %q", ch.GetEnded())
	}
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id})); code(err) != connect.CodeNotFound {
		t.Errorf("get of the dead sandbox: %v", err)
	}
}
