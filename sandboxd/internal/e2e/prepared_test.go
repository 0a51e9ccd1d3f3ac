package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// TestPreparedSandboxes: after a create, sandboxd prepares a sandbox of the
// template in the background (its container made, envd not started); the
// next create takes it, with the limits, environment and network it asks
// for, and a new one is prepared. A create without internet access does
// not take it. A sandboxd killed with SIGKILL leaves its prepared sandbox to
// the next one, which removes it; a clean stop removes it.
func TestPreparedSandboxes(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	first := h.create(nil).GetSandbox().GetId()
	prepared := h.waitPrepared(first)

	// The prepared sandbox's init waits before envd.
	if h.envdRunning(prepared) {
		t.Fatalf("prepared sandbox %s already runs envd", prepared)
	}
	took := h.create(func(r *sandboxdv1.CreateRequest) { r.EnvVars = map[string]string{"GREETING": "ahoy"} })
	sb := took.GetSandbox()
	if sb.GetId() != prepared {
		t.Fatalf("the second create started %s, not the prepared %s", sb.GetId(), prepared)
	}
	if got := h.mustRun(sb.GetId(), took.GetEnvdAccessToken(), "user", "echo $GREETING"); got.Stdout != "ahoy\n" {
		t.Errorf("command in the sandbox made from a prepared one: %+v", got)
	}
	// The create's limits (256 MiB, 1 CPU), not the defaults it was
	// prepared with (512 MiB, 2 CPUs).
	metrics, err := h.api.Metrics(ctx, connect.NewRequest(&sandboxdv1.MetricsRequest{SandboxId: sb.GetId()}))
	if err != nil {
		t.Fatal(err)
	}
	if ms := metrics.Msg.GetMetrics(); len(ms) == 0 || ms[len(ms)-1].GetMemTotal() != 256<<20 || ms[len(ms)-1].GetCpuCount() != 1 {
		t.Errorf("metrics of the sandbox made from a prepared one: %v", ms)
	}
	if !h.envdRunning(prepared) {
		t.Errorf("the sandbox made from a prepared one does not run envd")
	}
	if !strings.Contains(h.logTail(), "prepared=true") {
		t.Errorf("the create that took the prepared sandbox does not log prepared=true")
	}

	next := h.waitPrepared(first, prepared)
	offline := h.create(func(r *sandboxdv1.CreateRequest) { f := false; r.AllowInternetAccess = &f })
	if offline.GetSandbox().GetId() == next {
		t.Fatalf("a create without internet access took the prepared sandbox, which has it")
	}

	// SIGKILL: the prepared sandbox stays, unknown to the API; the next
	// sandboxd removes it as it removes any sandbox without a record.
	h.kill9()
	h.start()
	waitFor(t, 10*time.Second, "the orphaned prepared sandbox to be removed", func() bool { return h.gone(next) })
	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: next})); code(err) != connect.CodeNotFound {
		t.Errorf("the prepared sandbox is known to the API after a restart: %v", err)
	}

	// A clean stop removes the prepared sandbox it made after a create.
	again := h.create(nil).GetSandbox().GetId()
	last := h.waitPrepared(first, prepared, offline.GetSandbox().GetId(), again)
	h.killAll()
	h.stop()
	if !h.gone(last) {
		t.Errorf("prepared sandbox %s left after sandboxd stopped", last)
	}
	if ids := h.containers(); len(ids) != 0 {
		t.Errorf("containers left after every sandbox was killed and sandboxd stopped: %v", ids)
	}
}

// containers lists the sandboxes the native runtime holds state for.
func (h *host) containers() []string {
	h.t.Helper()
	entries, err := os.ReadDir(h.containersDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		h.t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

// waitPrepared waits for a container that is none of known: the prepared
// sandbox, which it returns.
func (h *host) waitPrepared(known ...string) string {
	h.t.Helper()
	var id string
	deadline := time.Now().Add(20 * time.Second)
	for id == "" {
		for _, c := range h.containers() {
			if !slices.Contains(known, c) {
				id = c
			}
		}
		if id == "" {
			if time.Now().After(deadline) {
				h.t.Fatalf("no prepared sandbox after 20s; containers: %v", h.containers())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Prepared once its container's state is written (after its network).
	waitFor(h.t.(*testing.T), 10*time.Second, "the prepared sandbox's container", func() bool {
		_, err := os.Stat(filepath.Join(h.containerDir(id), "state.json"))
		return err == nil
	})
	return id
}

// envdRunning reports whether the sandbox's init runs envd yet (not
// libcontainer's init, which waits before it).
func (h *host) envdRunning(id string) bool {
	h.t.Helper()
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(h.initPid(id)), "comm"))
	if err != nil {
		h.t.Fatal(err)
	}
	return strings.TrimSpace(string(comm)) == "envd"
}

// gone reports whether nothing of sandbox id is left: container state,
// root, network namespace, mounts.
func (h *host) gone(id string) bool {
	for _, p := range []string{
		filepath.Join(h.netOpts.RunDir, "netns", id),
		filepath.Join(h.state, "native", "sandboxes", id),
		h.containerDir(id),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			return false
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	return !strings.Contains(string(mounts), id)
}
