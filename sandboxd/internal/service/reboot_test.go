package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// snapshotting is the fake runtime with sandboxrt.Snapshotter: its copy of
// a sandbox's files is a layer of one file, and a test's hook runs in the
// middle of it (and can fail it). Its Pause fails with a context that
// ended, as a runtime that runs a command for it does.
type snapshotting struct {
	*servicetest.Runtime

	mu        sync.Mutex
	onCapture func(ctx context.Context, id string) error
	onStart   func(spec *sandboxrt.Spec)
}

func withSnapshots(r *servicetest.Runtime) *snapshotting { return &snapshotting{Runtime: r} }

// newSnapshotHarness is a harness with a snapshot store and the
// snapshotting runtime.
func newSnapshotHarness(t *testing.T) (*harness, *snapshotting) {
	var rt *snapshotting
	h := newHarness(t, harnessConfig{snapshots: true, wrap: func(r *servicetest.Runtime) sandboxrt.Runtime {
		rt = withSnapshots(r)
		return rt
	}})
	return h, rt
}

var _ sandboxrt.Snapshotter = (*snapshotting)(nil)

// CaptureLayer implements sandboxrt.Snapshotter.
func (r *snapshotting) CaptureLayer(ctx context.Context, id, dir string) error {
	r.mu.Lock()
	hook := r.onCapture
	r.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, id); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "written"), []byte(id), 0o644)
}

// Start implements sandboxrt.Runtime, running the test's hook first.
func (r *snapshotting) Start(ctx context.Context, spec *sandboxrt.Spec) error {
	r.mu.Lock()
	hook := r.onStart
	r.mu.Unlock()
	if hook != nil {
		hook(spec)
	}
	return r.Runtime.Start(ctx, spec)
}

// Pause implements sandboxrt.Runtime.
func (r *snapshotting) Pause(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.Runtime.Pause(ctx, id)
}

// setOnStart sets the hook Start runs first.
func (r *snapshotting) setOnStart(f func(spec *sandboxrt.Spec)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onStart = f
}

// setOnCapture sets the hook CaptureLayer runs first.
func (r *snapshotting) setOnCapture(f func(ctx context.Context, id string) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onCapture = f
}

func (h *harness) pause(id string, filesOnly bool) {
	h.t.Helper()
	if _, err := h.client.Pause(h.t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id, FilesOnly: filesOnly})); err != nil {
		h.t.Fatalf("Pause: %v", err)
	}
}

// assertFrozen fails unless id is paused with its memory, as recorded, and
// has no deadline.
func (h *harness) assertFrozen(id string) {
	h.t.Helper()
	if st, err := h.rt.Status(h.t.Context(), id); err != nil || st != sandboxrt.Paused {
		h.t.Fatalf("runtime status = %v, %v; want paused", st, err)
	}
	rec, err := h.reg.Get(id)
	if err != nil || rec.State != registry.StatePaused || rec.FilesOnly {
		h.t.Fatalf("record = %+v, %v; want paused with its memory", rec, err)
	}
	if _, ok := h.svc.deadlines.Deadline(id); ok {
		h.t.Fatal("a paused sandbox has a deadline")
	}
}

// resumes checks that a plain Resume of id works (after a failed reboot).
func (h *harness) resumes(id string) {
	h.t.Helper()
	resp, err := h.client.Resume(h.t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id}))
	if err != nil {
		h.t.Fatalf("Resume after the failed reboot: %v", err)
	}
	if resp.Msg.GetSandbox().GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING {
		h.t.Fatalf("resumed sandbox = %v", resp.Msg.GetSandbox())
	}
	if _, ok := h.svc.deadlines.Deadline(id); !ok {
		h.t.Fatal("resumed sandbox has no deadline")
	}
}

// TestRebootWithoutSnapshots: a host without a snapshot store cannot keep a
// sandbox's files, so a Resume with reboot of a sandbox paused with its
// memory is refused before anything thaws it.
func TestRebootWithoutSnapshots(t *testing.T) {
	h := newHarness(t, harnessConfig{wrap: func(r *servicetest.Runtime) sandboxrt.Runtime { return withSnapshots(r) }})
	id := h.create().GetSandbox().GetId()
	h.pause(id, false)
	_, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Reboot: true}))
	wantCode(t, err, connect.CodeUnimplemented, "snapshot")
	h.assertFrozen(id)
	h.resumes(id)
}

// TestRebootFailureFreezesAgain: a reboot whose copy of the files fails
// after the thaw freezes the sandbox again, though the caller has gone
// meanwhile (a long copy), so that it is paused as recorded and a later
// resume works.
func TestRebootFailureFreezesAgain(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	id := h.create().GetSandbox().GetId()
	h.pause(id, false)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rt.setOnCapture(func(sctx context.Context, _ string) error {
		cancel() // the caller gives up during the copy
		select {
		case <-sctx.Done():
		case <-time.After(5 * time.Second):
			t.Error("the request's context did not end with its caller")
		}
		return errors.New("no space left on device")
	})
	_, err := h.client.Resume(ctx, connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Reboot: true}))
	if err == nil {
		t.Fatal("a reboot whose copy failed succeeded")
	}
	h.svc.locks.lock(id)() // the Resume's handler is done
	h.assertFrozen(id)

	rt.setOnCapture(func(context.Context, string) error { return errors.New("no space left on device") })
	_, err = h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Reboot: true}))
	wantCode(t, err, connect.CodeInternal, "no space left")
	h.assertFrozen(id)

	rt.setOnCapture(nil)
	h.resumes(id)
}

// A sandbox that boots again on its files (a resume after a files-only
// pause) starts with its log cut to its newest lines: each boot's envd has
// a budget of its own, and pausing and resuming again and again would
// otherwise grow the log on the host without bound.
func TestBootTrimsTheLog(t *testing.T) {
	h, _ := newSnapshotHarness(t)
	id := h.create().GetSandbox().GetId()
	h.pause(id, true)
	block := []byte(strings.Repeat(`{"time":"2026-12-07T06:00:00Z","source":"stdout","line":"x"}`+"\n", 1<<14))
	f, err := os.OpenFile(h.svc.logPath(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	for written := 0; written <= maxLogBytes; written += len(block) {
		if _, err := f.Write(block); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	h.resumes(id)
	st, err := os.Stat(h.svc.logPath(id))
	if err != nil || st.Size() > keptLogBytes || st.Size() == 0 {
		t.Fatalf("the log after the boot: %v bytes (%v), want its newest lines, at most %d bytes", st.Size(), err, keptLogBytes)
	}
}

// inPlace is snapshotting with a pause in place (sandboxrt.InPlacePauser),
// as the native runtime's: it counts its resumes.
type inPlace struct {
	*snapshotting
	resumes atomic.Int32
}

func (*inPlace) PausesInPlace() {}

func (r *inPlace) Resume(ctx context.Context, id string) error {
	r.resumes.Add(1)
	return r.snapshotting.Resume(ctx, id)
}

// On a runtime that pauses in place, a pause to files copies the sandbox
// frozen and stops it without a thaw: what it would write after the copy
// cannot be lost. A copy that fails thaws it, running as before; a resume
// with a reboot of one paused with its memory copies it frozen too.
func TestPauseFilesFrozenInPlace(t *testing.T) {
	var rt *inPlace
	h := newHarness(t, harnessConfig{snapshots: true, wrap: func(r *servicetest.Runtime) sandboxrt.Runtime {
		rt = &inPlace{snapshotting: withSnapshots(r)}
		return rt
	}})
	var during []sandboxrt.Status
	rt.mu.Lock()
	rt.onCapture = func(ctx context.Context, id string) error {
		st, _ := rt.Status(ctx, id)
		during = append(during, st)
		return nil
	}
	rt.mu.Unlock()

	id := h.create().GetSandbox().GetId()
	h.pause(id, true)
	if len(during) != 1 || during[0] != sandboxrt.Paused || rt.resumes.Load() != 0 || !rt.WasStopped(id) {
		t.Fatalf("copied while %v, %d thaws, stopped %v; want one copy frozen, no thaw, stopped", during, rt.resumes.Load(), rt.WasStopped(id))
	}

	id = h.create().GetSandbox().GetId()
	rt.mu.Lock()
	rt.onCapture = func(context.Context, string) error { return errors.New("disk on fire") }
	rt.mu.Unlock()
	if _, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id, FilesOnly: true})); err == nil {
		t.Fatal("a pause whose copy failed succeeded")
	}
	if st, _ := rt.Status(t.Context(), id); st != sandboxrt.Running {
		t.Fatalf("after the failed pause the sandbox is %v; want it thawed, running", st)
	}

	rt.mu.Lock()
	during = nil
	rt.onCapture = func(ctx context.Context, id string) error {
		st, _ := rt.Status(ctx, id)
		during = append(during, st)
		return nil
	}
	rt.mu.Unlock()
	h.pause(id, false)
	before := rt.resumes.Load()
	if _, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Timeout: durationpb.New(time.Minute), Reboot: true})); err != nil {
		t.Fatal(err)
	}
	if len(during) != 1 || during[0] != sandboxrt.Paused || rt.resumes.Load() != before {
		t.Fatalf("a resume with a reboot copied while %v with %d thaws; want one copy frozen, no thaw", during, rt.resumes.Load()-before)
	}
}
