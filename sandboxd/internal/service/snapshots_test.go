package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// stateCapturing is snapshotting with sandboxrt.StateCapturer: its state
// image is a directory of one file.
type stateCapturing struct{ *snapshotting }

var _ sandboxrt.StateCapturer = stateCapturing{}

func (r stateCapturing) CaptureState(ctx context.Context, id, layerDir, imageDir string) error {
	if err := r.CaptureLayer(ctx, id, layerDir); err != nil {
		return err
	}
	if err := os.Mkdir(imageDir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(imageDir, "memory"), []byte(id), 0o600)
}

func (stateCapturing) ImageFormat() (string, error) { return "fake-1", nil }

// TestForkLayerHeldFromSweeps: a fork's layer is in place before any record
// names it, and a kill of a sandbox with layers, which sweeps them, comes
// while the first fork starts. The layer stays for the forks, and goes
// with the last of them.
func TestForkLayerHeldFromSweeps(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	src := h.create().GetSandbox().GetId()
	snap, err := h.client.Snapshot(t.Context(), connect.NewRequest(&pb.SnapshotRequest{SandboxId: src, Team: "team-a"}))
	if err != nil {
		t.Fatal(err)
	}
	stacked := h.create(func(m *pb.CreateRequest) { m.Snapshot = snap.Msg.GetSnapshot().GetId() }).GetSandbox().GetId()

	var once sync.Once
	rt.setOnStart(func(*sandboxrt.Spec) {
		once.Do(func() {
			if _, err := h.client.Kill(context.Background(), connect.NewRequest(&pb.KillRequest{SandboxId: stacked})); err != nil {
				t.Errorf("Kill of the sandbox on the snapshot: %v", err)
			}
		})
	})
	resp, err := h.client.Fork(t.Context(), connect.NewRequest(&pb.ForkRequest{
		SandboxId: src, Team: "team-a", Count: 2, Timeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !h.gone(stacked) {
		t.Fatal("the kill in the middle of the fork did not happen: the test shows nothing")
	}
	var forks []string
	var layers []string
	for _, r := range resp.Msg.GetForks() {
		if r.GetErrorCode() != "" {
			t.Fatalf("fork failed: %s: %s", r.GetErrorCode(), r.GetErrorMessage())
		}
		id := r.GetCreated().GetSandbox().GetId()
		forks = append(forks, id)
		rec, err := h.reg.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		layers = rec.Layers
	}
	if len(layers) != 1 {
		t.Fatalf("a fork's layers = %v, want the fork's own", layers)
	}
	if !h.svc.snapshots.HasLayer(layers[0]) {
		t.Fatalf("the forks' layer %s was swept while they started", layers[0])
	}
	for _, id := range forks {
		if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
	}
	if h.svc.snapshots.HasLayer(layers[0]) {
		t.Fatalf("the forks' layer %s outlived the last fork", layers[0])
	}
}

// TestSnapshotLayersHeldWhileStarting: a sandbox started from a snapshot
// has the snapshot's layers under it before its record names them; a
// DeleteSnapshot meanwhile (whose sweep follows) must leave them.
func TestSnapshotLayersHeldWhileStarting(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	src := h.create().GetSandbox().GetId()
	snap, err := h.client.Snapshot(t.Context(), connect.NewRequest(&pb.SnapshotRequest{SandboxId: src, Team: "team-a"}))
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.Msg.GetSnapshot().GetId()
	var deleted atomic.Bool
	rt.setOnStart(func(*sandboxrt.Spec) {
		if deleted.CompareAndSwap(false, true) {
			if _, err := h.client.DeleteSnapshot(context.Background(), connect.NewRequest(&pb.DeleteSnapshotRequest{Team: "team-a", Snapshot: snapID})); err != nil {
				t.Errorf("DeleteSnapshot while a sandbox starts from it: %v", err)
			}
		}
	})
	id := h.create(func(m *pb.CreateRequest) { m.Snapshot = snapID }).GetSandbox().GetId()
	if !deleted.Load() {
		t.Fatal("the snapshot was not deleted during the start: the test shows nothing")
	}
	rec, err := h.reg.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Layers) == 0 {
		t.Fatal("the sandbox from the snapshot has no layers")
	}
	for _, l := range rec.Layers {
		if !h.svc.snapshots.HasLayer(l) {
			t.Errorf("layer %s under the sandbox was swept while it started", l)
		}
	}
}

// TestCapturesHeld: the copy of a files-only pause and that of a snapshot
// (layer and image) are in place before any record names them; sweeps
// keep them until they are released.
func TestCapturesHeld(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	id := h.create().GetSandbox().GetId()
	ctx := t.Context()

	layerID, release, err := h.svc.captureLayer(ctx, rt, id)
	if err != nil {
		t.Fatal(err)
	}
	h.svc.gcLayers(ctx)
	if !h.svc.snapshots.HasLayer(layerID) {
		t.Fatal("a sweep removed a captured layer before a record named it")
	}
	release()
	release() // once more is nothing
	h.svc.gcLayers(ctx)
	if h.svc.snapshots.HasLayer(layerID) {
		t.Fatal("a released layer no record names outlived a sweep")
	}

	layerID, imageID, imageTmp, _, release, err := h.svc.captureState(ctx, stateCapturing{rt}, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.snapshots.CommitImage(imageID, imageTmp); err != nil {
		t.Fatal(err)
	}
	h.svc.gcLayers(ctx)
	if !h.svc.snapshots.HasLayer(layerID) || !h.svc.snapshots.HasImage(imageID) {
		t.Fatalf("a sweep removed a captured layer (kept %v) or image (kept %v) before a record named them",
			h.svc.snapshots.HasLayer(layerID), h.svc.snapshots.HasImage(imageID))
	}
	release()
	h.svc.gcLayers(ctx)
	if h.svc.snapshots.HasLayer(layerID) || h.svc.snapshots.HasImage(imageID) {
		t.Fatal("a released layer or image no record names outlived a sweep")
	}
}

// A sandbox whose files are one layer short of what a sandbox can start
// from (sandboxrt.MaxLayers) is not snapshotted, forked or paused to its
// files: the new layer would be made, and nothing could start from it once
// a host reboot adds the last (a pause with memory kept as files).
func TestLayerDepthBounded(t *testing.T) {
	h, _ := newSnapshotHarness(t)
	id := h.create().GetSandbox().GetId()
	h.deepen(id, sandboxrt.MaxLayers-1)
	ctx := t.Context()
	_, err := h.client.Snapshot(ctx, connect.NewRequest(&pb.SnapshotRequest{SandboxId: id, Team: "team-a"}))
	wantCode(t, err, connect.CodeFailedPrecondition, "498 layers deep")
	_, err = h.client.Fork(ctx, connect.NewRequest(&pb.ForkRequest{SandboxId: id, Team: "team-a", Count: 1, Timeout: durationpb.New(time.Minute)}))
	wantCode(t, err, connect.CodeFailedPrecondition, "498 layers deep")
	_, err = h.client.Pause(ctx, connect.NewRequest(&pb.PauseRequest{SandboxId: id, FilesOnly: true}))
	wantCode(t, err, connect.CodeFailedPrecondition, "498 layers deep")
	if sb, err := h.get(id); err != nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("after the refusals: %v, %v; want it running", sb.GetState(), err)
	}
}

// A paused sandbox is not found for a snapshot, as on e2b, whose store of
// live sandboxes holds no paused one; a fork of it is a conflict, in e2b's
// words.
func TestSnapshotOfPaused(t *testing.T) {
	h, _ := newSnapshotHarness(t)
	id := h.create().GetSandbox().GetId()
	h.pause(id, false)
	ctx := t.Context()
	_, err := h.client.Snapshot(ctx, connect.NewRequest(&pb.SnapshotRequest{SandboxId: id, Team: "team-a"}))
	wantCode(t, err, connect.CodeNotFound, "paused")
	_, err = h.client.Fork(ctx, connect.NewRequest(&pb.ForkRequest{SandboxId: id, Team: "team-a", Count: 1, Timeout: durationpb.New(time.Minute)}))
	wantCode(t, err, connect.CodeFailedPrecondition, "Sandbox '"+id+"' is paused and cannot be forked; resume it first")
	if sb, err := h.get(id); err != nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("after the refusals: %v, %v; want it paused", sb.GetState(), err)
	}
}

// deepen stacks id's files n fake layers deeper.
func (h *harness) deepen(id string, n int) {
	h.t.Helper()
	if _, err := h.reg.Update(id, func(r *store.Record) error {
		for i := range n {
			r.Layers = append(r.Layers, fmt.Sprintf("l%d", i))
		}
		return nil
	}); err != nil {
		h.t.Fatal(err)
	}
}

// A sandbox too deep to pause to its files at its deadline is paused with
// its memory instead: refused, the pause would be tried again and again
// and the sandbox run on.
func TestDeadlinePauseTooDeepKeepsMemory(t *testing.T) {
	h, _ := newSnapshotHarness(t)
	id := h.create(func(m *pb.CreateRequest) { m.AutoPause, m.AutoPauseFilesOnly = true, true }).GetSandbox().GetId()
	h.deepen(id, maxMadeLayers)
	h.clock.Step(5 * time.Minute)
	eventually(t, "the pause at the deadline", func() bool {
		rec, err := h.reg.Get(id)
		return err == nil && rec.State == registry.StatePaused
	})
	if rec, _ := h.reg.Get(id); rec.FilesOnly || len(rec.Layers) != maxMadeLayers {
		t.Fatalf("paused with files only %v on %d layers; want its memory, on %d", rec.FilesOnly, len(rec.Layers), maxMadeLayers)
	}
	h.assertFrozen(id)
}

// A sandbox paused to its files past the layers a sandbox starts on (two
// host reboots' salvages in a row) is refused a resume with a reason, and
// stays paused.
func TestResumePastTheLayersRefused(t *testing.T) {
	h, _ := newSnapshotHarness(t)
	id := h.create().GetSandbox().GetId()
	h.pause(id, true)
	h.deepen(id, sandboxrt.MaxLayers)
	_, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Timeout: durationpb.New(time.Minute)}))
	wantCode(t, err, connect.CodeFailedPrecondition, "500 layers deep, past the 499")
	if sb, err := h.get(id); err != nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("after the refusal: %v, %v; want it paused", sb.GetState(), err)
	}
}

// stackedOnDeleted is a sandbox started from a snapshot since deleted: its
// layers are named by its own record only.
func stackedOnDeleted(t *testing.T, h *harness, mod ...func(*pb.CreateRequest)) (id string, layers []string) {
	t.Helper()
	src := h.create().GetSandbox().GetId()
	snap, err := h.client.Snapshot(t.Context(), connect.NewRequest(&pb.SnapshotRequest{SandboxId: src, Team: "team-a"}))
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.Msg.GetSnapshot().GetId()
	id = h.create(append([]func(*pb.CreateRequest){func(m *pb.CreateRequest) { m.Snapshot = snapID }}, mod...)...).GetSandbox().GetId()
	if _, err := h.client.DeleteSnapshot(t.Context(), connect.NewRequest(&pb.DeleteSnapshotRequest{Team: "team-a", Snapshot: snapID})); err != nil {
		t.Fatal(err)
	}
	rec, err := h.reg.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Layers) == 0 {
		t.Fatal("the sandbox from the snapshot has no layers")
	}
	return id, rec.Layers
}

// TestCaptureHoldsSourceLayers: a snapshot's or a fork's copy lists the
// source's layers under the new one, and the source may end (a kill, its
// deadline) once the copy lets go of its lock, before a record names them:
// its sweep must leave them.
func TestCaptureHoldsSourceLayers(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	src, layers := stackedOnDeleted(t, h)
	unlock := h.svc.locks.lock(src)
	c, err := h.svc.captureLocked(t.Context(), rt, src, "team-a", "snapshotted")
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: src})); err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		if !h.svc.snapshots.HasLayer(l) {
			t.Fatalf("the source's layer %s was swept at its kill, before the snapshot's record named it", l)
		}
	}
	c.release()
	h.svc.gcLayers(t.Context())
	for _, l := range append([]string{c.layer}, layers...) {
		if h.svc.snapshots.HasLayer(l) {
			t.Fatalf("layer %s, released and named by no record, outlived a sweep", l)
		}
	}
}

// TestForkOfEndingSource: the source ends while its first fork starts; the
// forks keep every layer under them, and the source's settings.
func TestForkOfEndingSource(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	src, layers := stackedOnDeleted(t, h, func(m *pb.CreateRequest) {
		m.EnvVars = map[string]string{"FOO": "bar"}
		m.AutoPause, m.AutoPauseFilesOnly = true, true
	})
	var once sync.Once
	rt.setOnStart(func(*sandboxrt.Spec) {
		once.Do(func() {
			if _, err := h.client.Kill(context.Background(), connect.NewRequest(&pb.KillRequest{SandboxId: src})); err != nil {
				t.Errorf("Kill of the source: %v", err)
			}
		})
	})
	resp, err := h.client.Fork(t.Context(), connect.NewRequest(&pb.ForkRequest{
		SandboxId: src, Team: "team-a", Count: 2, Timeout: durationpb.New(time.Minute),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !h.gone(src) {
		t.Fatal("the kill in the middle of the fork did not happen: the test shows nothing")
	}
	for _, r := range resp.Msg.GetForks() {
		if r.GetErrorCode() != "" {
			t.Fatalf("fork failed: %s: %s", r.GetErrorCode(), r.GetErrorMessage())
		}
		id := r.GetCreated().GetSandbox().GetId()
		rec, err := h.reg.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Layers) != len(layers)+1 {
			t.Fatalf("fork %s has layers %v, want its own over the source's %v", id, rec.Layers, layers)
		}
		for _, l := range rec.Layers {
			if !h.svc.snapshots.HasLayer(l) {
				t.Fatalf("layer %s under fork %s was swept while it started", l, id)
			}
		}
		if rec.EnvVars["FOO"] != "bar" || !rec.AutoPause || !rec.AutoPauseFilesOnly {
			t.Errorf("fork %s: env %v, auto-pause %v, files only %v; want the source's", id, rec.EnvVars, rec.AutoPause, rec.AutoPauseFilesOnly)
		}
		if env := rt.Envd(id).State().Env; env["FOO"] != "bar" || env["E2B_SANDBOX_ID"] != id {
			t.Errorf("fork %s's envd has env %v; want the source's, with its own E2B_SANDBOX_ID", id, env)
		}
	}
}

// TestSnapshotNameTakenOnce: snapshots of two sandboxes given one name at
// once leave one snapshot of that name.
func TestSnapshotNameTakenOnce(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	for round := range 10 {
		a, b := h.create().GetSandbox().GetId(), h.create().GetSandbox().GetId()
		// Both copies are made before either goes on to take the name.
		var arrived sync.WaitGroup
		arrived.Add(2)
		rt.mu.Lock()
		rt.onCapture = func(context.Context, string) error {
			arrived.Done()
			arrived.Wait()
			return nil
		}
		rt.mu.Unlock()
		name := fmt.Sprintf("same-%d", round)
		var wg sync.WaitGroup
		for _, id := range []string{a, b} {
			wg.Go(func() {
				if _, err := h.client.Snapshot(t.Context(), connect.NewRequest(&pb.SnapshotRequest{SandboxId: id, Team: "team-a", Name: name})); err != nil {
					t.Errorf("Snapshot of %s: %v", id, err)
				}
			})
		}
		wg.Wait()
		list, err := h.client.ListSnapshots(t.Context(), connect.NewRequest(&pb.ListSnapshotsRequest{Team: "team-a", Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(list.Msg.GetSnapshots()); n != 1 {
			t.Fatalf("round %d: %d snapshots named %s, want 1", round, n, name)
		}
	}
}

// TestDeadlinePauseFilesRefusedKeepsMemory: a sandbox whose pause to its
// files fails at its deadline (under gVisor, files too large to copy
// through its memory) is paused with its memory instead, not left running.
func TestDeadlinePauseFilesRefusedKeepsMemory(t *testing.T) {
	h, rt := newSnapshotHarness(t)
	id := h.create(func(m *pb.CreateRequest) { m.AutoPause, m.AutoPauseFilesOnly = true, true }).GetSandbox().GetId()
	rt.mu.Lock()
	rt.onCapture = func(context.Context, string) error { return fmt.Errorf("%w: too large", sandboxrt.ErrCaptureTooLarge) }
	rt.mu.Unlock()
	h.clock.Step(5 * time.Minute)
	eventually(t, "the pause at the deadline", func() bool {
		rec, err := h.reg.Get(id)
		return err == nil && rec.State == registry.StatePaused
	})
	if rec, _ := h.reg.Get(id); rec.FilesOnly {
		t.Fatal("paused with its files only; want its memory")
	}
	h.assertFrozen(id)
}
