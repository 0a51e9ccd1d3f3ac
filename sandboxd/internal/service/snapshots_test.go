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
