package service

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// A host whose state filesystem has less free space than --disk-reserve
// refuses what would write more there (creates, snapshots, forks, pulls,
// pauses to disk) with resource_exhausted, which the apiserver answers by
// placing it elsewhere; a freeze and a kill still work. Measured on a real
// 16 MiB tmpfs.
func TestDiskReserve(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=16m"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) })
	h := newHarness(t, harnessConfig{snapshots: true, stateDir: state, cfg: func(c *Config) { c.DiskReserveMiB = 8 },
		wrap: func(r *servicetest.Runtime) sandboxrt.Runtime { return withSnapshots(r) }})
	ctx := t.Context()
	id := h.create().GetSandbox().GetId() // 16 MiB free
	// The Watch stream says when the pressure changes; Info says what it is.
	hostChanged := watchHostChanged(t, h)
	wantPressure := func(want bool) {
		t.Helper()
		info, err := h.client.Info(ctx, connect.NewRequest(&pb.InfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Msg.GetDiskPressure(); got != want || info.Msg.GetVolumeDiskPressure() {
			t.Fatalf("Info: disk_pressure %v (volumes %v), want %v", got, info.Msg.GetVolumeDiskPressure(), want)
		}
	}
	wantPressure(false)
	filler := filepath.Join(state, "filler")
	if err := os.WriteFile(filler, make([]byte, 10<<20), 0o600); err != nil {
		t.Fatal(err)
	}

	// The first refusal tells the Watch streams at once, before the
	// host's next measure.
	_, err := h.client.Create(ctx, createReq())
	wantCode(t, err, connect.CodeResourceExhausted, "create: this host's disk is nearly full: 6 MiB free on "+state, "below its reserve of 8 MiB (--disk-reserve)")
	waitHostChanged(t, hostChanged, "the first refusal")
	wantPressure(true)
	_, err = h.client.Snapshot(ctx, connect.NewRequest(&pb.SnapshotRequest{SandboxId: id, Team: "team-a"}))
	wantCode(t, err, connect.CodeResourceExhausted, "snapshot: this host's disk is nearly full")
	_, err = h.client.Fork(ctx, connect.NewRequest(&pb.ForkRequest{SandboxId: id, Team: "team-a", Count: 1, Timeout: durationpb.New(time.Minute)}))
	wantCode(t, err, connect.CodeResourceExhausted, "fork: this host's disk is nearly full")
	_, err = h.client.PullSnapshot(ctx, connect.NewRequest(&pb.PullSnapshotRequest{SnapshotId: "aaaaaaaaaaaaaaaaaaaa", Team: "team-a",
		SourceUrl: "http://127.0.0.1:1", Ticket: "t"}))
	wantCode(t, err, connect.CodeResourceExhausted, "pull snapshot: this host's disk is nearly full")
	_, err = h.client.Pause(ctx, connect.NewRequest(&pb.PauseRequest{SandboxId: id, FilesOnly: true}))
	wantCode(t, err, connect.CodeResourceExhausted, "pause: this host's disk is nearly full")

	// A freeze writes nothing: it is not refused; nor is a kill.
	if _, err := h.client.Pause(ctx, connect.NewRequest(&pb.PauseRequest{SandboxId: id})); err != nil {
		t.Fatalf("a freeze on a full disk: %v", err)
	}
	if _, err := h.client.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
		t.Fatalf("a kill on a full disk: %v", err)
	}
	// Space again: the next measure announces it, and creates go on.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(10 * time.Second)
	waitHostChanged(t, hostChanged, "the measure after space came back")
	wantPressure(false)
	h.create()
}

// watchHostChanged opens a Watch stream on h and passes on each of its
// HostChanged messages.
func watchHostChanged(t *testing.T, h *harness) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := h.client.Watch(ctx, connect.NewRequest(&pb.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetSnapshot() == nil {
		t.Fatalf("Watch: no snapshot first: %v", stream.Err())
	}
	ch := make(chan struct{}, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for stream.Receive() {
			if stream.Msg().GetHostChanged() != nil {
				ch <- struct{}{}
			}
		}
	}()
	t.Cleanup(func() { cancel(); _ = stream.Close(); <-done })
	return ch
}

func waitHostChanged(t *testing.T, ch <-chan struct{}, after string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no HostChanged on Watch after %s", after)
	}
}
