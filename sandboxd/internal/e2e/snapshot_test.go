package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

func TestSnapshots(t *testing.T) {
	t.Run("native", func(t *testing.T) { testSnapshots(t, newHost(t)) })
	t.Run("gvisor", func(t *testing.T) {
		runsc := os.Getenv("SKIFF_RUNSC")
		if _, err := os.Stat(runsc); err != nil {
			t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
		}
		testSnapshots(t, newHost(t, "--runtime", "gvisor", "--runsc", runsc))
	})
}

// layers is the number of snapshot layers on the host.
func (h *host) layers(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(h.state, "snapshots", "layers"))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func (h *host) snapshot(t *testing.T, id, team, name string) *sandboxdv1.Snapshot {
	t.Helper()
	began := time.Now()
	resp, err := h.api.Snapshot(context.Background(), connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: team, Name: name}))
	if err != nil {
		t.Fatalf("snapshot of %s: %v\n%s", id, err, h.logTail())
	}
	t.Logf("snapshot of %s: %s, %d bytes", id, time.Since(began).Round(time.Millisecond), resp.Msg.GetSnapshot().GetSizeBytes())
	return resp.Msg.GetSnapshot()
}

func (h *host) listSnapshots(t *testing.T, req *sandboxdv1.ListSnapshotsRequest) []string {
	t.Helper()
	resp, err := h.api.ListSnapshots(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range resp.Msg.GetSnapshots() {
		ids = append(ids, s.GetId())
	}
	return ids
}

func testSnapshots(t *testing.T, h *host) {
	ctx := context.Background()
	a := h.create(nil)
	aID, aTok := a.GetSandbox().GetId(), a.GetEnvdAccessToken()
	// Files written, a directory, a symlink, a file of the template
	// deleted, and one owned by the sandbox's user.
	h.mustRun(aID, aTok, "root", "mkdir -p /data/deep && echo v1 > /data/f && ln -s f /data/link && rm /bin/vi && echo mine > /tmp/mine && chown 1000:1000 /tmp/mine")

	snap := h.snapshot(t, aID, "team-a", "snap-1")
	if snap.GetName() != "snap-1" || snap.GetTag() != "default" || snap.GetSourceSandboxId() != aID || snap.GetTeam() != "team-a" || snap.GetTemplate() != h.template {
		t.Errorf("snapshot = %v", snap)
	}
	// The source runs on, and its writes after the snapshot stay its own.
	h.mustRun(aID, aTok, "root", "echo v2 > /data/f")

	check := func(id, token, want string) {
		t.Helper()
		got := h.mustRun(id, token, "root", "cat /data/f; readlink /data/link; test -e /bin/vi && echo vi; stat -c %u /tmp/mine; test -d /data/deep && echo deep")
		if got.Stdout != want {
			t.Errorf("in %s: %q, want %q", id, got.Stdout, want)
		}
	}
	b := h.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = snap.GetId() })
	c := h.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = "snap-1:default" })
	bID, bTok, cID, cTok := b.GetSandbox().GetId(), b.GetEnvdAccessToken(), c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	if b.GetSandbox().GetSnapshot() != snap.GetId() || b.GetSandbox().GetTemplate() != h.template {
		t.Errorf("a sandbox from the snapshot says snapshot %q template %q", b.GetSandbox().GetSnapshot(), b.GetSandbox().GetTemplate())
	}
	check(bID, bTok, "v1\nf\n1000\ndeep\n")
	check(cID, cTok, "v1\nf\n1000\ndeep\n")
	check(aID, aTok, "v2\nf\n1000\ndeep\n")
	// Copies are independent.
	h.mustRun(bID, bTok, "root", "echo from-b > /data/f && rm /data/link")
	check(cID, cTok, "v1\nf\n1000\ndeep\n")

	// A snapshot of a sandbox started from one keeps the layers below.
	snap2 := h.snapshot(t, bID, "team-a", "")
	d := h.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = snap2.GetId() })
	check(d.GetSandbox().GetId(), d.GetEnvdAccessToken(), "from-b\n1000\ndeep\n")

	// Lists and filters; another team sees nothing of them.
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); !slices.Equal(got, []string{snap2.GetId(), snap.GetId()}) {
		t.Errorf("list = %v, want %v newest first", got, []string{snap2.GetId(), snap.GetId()})
	}
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a", SandboxId: bID}); !slices.Equal(got, []string{snap2.GetId()}) {
		t.Errorf("list by sandbox = %v", got)
	}
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a", Name: "snap-1"}); !slices.Equal(got, []string{snap.GetId()}) {
		t.Errorf("list by name = %v", got)
	}
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-b"}); len(got) != 0 {
		t.Errorf("team-b lists %v", got)
	}
	_, err := h.api.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{Snapshot: snap.GetId(), Team: "team-b", Timeout: durationpb.New(time.Minute)}))
	if code(err) != connect.CodeNotFound {
		t.Errorf("team-b creates from team-a's snapshot: %v", err)
	}
	_, err = h.api.Snapshot(ctx, connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: aID, Team: "team-b"}))
	if code(err) != connect.CodeNotFound {
		t.Errorf("team-b snapshots team-a's sandbox: %v", err)
	}
	_, err = h.api.Snapshot(ctx, connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: aID, Team: "team-a", Name: "Bad Name"}))
	if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "name") {
		t.Errorf("a bad name: %v", err)
	}

	// kill -9 of sandboxd: every snapshot is kept, and starts sandboxes.
	h.kill9()
	h.start()
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(got) != 2 {
		t.Fatalf("after kill -9: %v", got)
	}
	e := h.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = snap.GetId() })
	check(e.GetSandbox().GetId(), e.GetEnvdAccessToken(), "v1\nf\n1000\ndeep\n")

	// Fork: two sandboxes from the source as it is now.
	fork, err := h.api.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{SandboxId: aID, Team: "team-a", Count: 2, Timeout: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatalf("fork: %v\n%s", err, h.logTail())
	}
	if len(fork.Msg.GetForks()) != 2 {
		t.Fatalf("fork gave %d results", len(fork.Msg.GetForks()))
	}
	var forks []string
	for _, f := range fork.Msg.GetForks() {
		if f.GetCreated() == nil {
			t.Fatalf("a fork failed: %s %s", f.GetErrorCode(), f.GetErrorMessage())
		}
		forks = append(forks, f.GetCreated().GetSandbox().GetId())
		check(f.GetCreated().GetSandbox().GetId(), f.GetCreated().GetEnvdAccessToken(), "v2\nf\n1000\ndeep\n")
	}
	_, err = h.api.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{SandboxId: aID, Team: "team-a", Count: 0, Timeout: durationpb.New(time.Minute)}))
	if code(err) != connect.CodeInvalidArgument {
		t.Errorf("fork count 0: %v", err)
	}

	// Deleting a snapshot that sandboxes run from: gone from the list at
	// once, its layers kept until the last of them ends.
	if _, err := h.api.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: "snap-1", Team: "team-b"})); code(err) != connect.CodeNotFound {
		t.Errorf("team-b deletes team-a's snapshot: %v", err)
	}
	for _, ref := range []string{"snap-1", snap2.GetId()} {
		if _, err := h.api.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: ref, Team: "team-a"})); err != nil {
			t.Fatalf("delete %s: %v", ref, err)
		}
	}
	if _, err := h.api.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: snap.GetId(), Team: "team-a"})); code(err) != connect.CodeNotFound {
		t.Errorf("a second delete: %v", err)
	}
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(got) != 0 {
		t.Errorf("after delete: %v", got)
	}
	check(cID, cTok, "v1\nf\n1000\ndeep\n")
	if n := h.layers(t); n != 3 {
		t.Errorf("%d layers while sandboxes use them, want 3 (snap-1's, snap2's, the fork's)", n)
	}
	for _, id := range append([]string{aID, bID, cID, d.GetSandbox().GetId(), e.GetSandbox().GetId()}, forks...) {
		if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.layers(t); n != 0 {
		t.Errorf("%d layers left after every user ended", n)
	}
}

// Under gVisor a file is copied through the sentry's memory: a snapshot
// that would not fit is refused with the reason, and the sandbox runs on
// (before the check, 1 GiB written under a 512 MiB limit got the sandbox
// OOM-killed).
func TestGvisorSnapshotTooLarge(t *testing.T) {
	runsc := os.Getenv("SKIFF_RUNSC")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
	}
	h := newHost(t, "--runtime", "gvisor", "--runsc", runsc)
	c := h.create(func(r *sandboxdv1.CreateRequest) { r.Resources.DiskMib = 1024 })
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	h.mustRun(id, token, "root", "dd if=/dev/urandom of=/big bs=1048576 count=300 2>/dev/null && echo ok")
	_, err := h.api.Snapshot(context.Background(), connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: "team-a"}))
	if code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "give it more memory") {
		t.Fatalf("snapshot of 300 MiB under a 256 MiB limit: %v", err)
	}
	if got := h.mustRun(id, token, "root", "ls -l /big | wc -l"); got.Stdout != "1\n" {
		t.Errorf("after the refused snapshot: %q", got.Stdout)
	}
	if n := h.layers(t); n != 0 {
		t.Errorf("%d layers left by a refused snapshot", n)
	}
}

// kill -9 of sandboxd while it copies a sandbox's files: the next one
// lists no snapshot, keeps no layer, and finds the sandbox running (it was
// frozen for the copy).
func TestKill9DuringSnapshot(t *testing.T) {
	t.Run("native", func(t *testing.T) { testKill9DuringSnapshot(t, newHost(t), 1024) })
	t.Run("gvisor", func(t *testing.T) {
		runsc := os.Getenv("SKIFF_RUNSC")
		if _, err := os.Stat(runsc); err != nil {
			t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
		}
		testKill9DuringSnapshot(t, newHost(t, "--runtime", "gvisor", "--runsc", runsc), 400)
	})
}

func testKill9DuringSnapshot(t *testing.T, h *host, mib int) {
	c := h.create(func(r *sandboxdv1.CreateRequest) {
		r.Resources.DiskMib = int64(2*mib + 512)
		r.Resources.MemoryMib = int64(2*mib + 512)
	})
	id, token := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	h.mustRun(id, token, "root", fmt.Sprintf("dd if=/dev/urandom of=/big bs=1048576 count=%d 2>/dev/null && sync && echo ok", mib))
	done := make(chan error, 1)
	go func() {
		_, err := h.api.Snapshot(context.Background(), connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: "team-a", Name: "cut"}))
		done <- err
	}()
	// Killed once the copy has begun: a layer being written is there.
	waitFor(t, 30*time.Second, "the copy to start", func() bool {
		entries, _ := os.ReadDir(filepath.Join(h.state, "snapshots", "layers"))
		return len(entries) > 0
	})
	h.kill9()
	if err := <-done; err == nil {
		t.Fatal("the snapshot finished before the kill: make the sandbox's files bigger")
	}
	h.start()
	if got := h.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(got) != 0 {
		t.Errorf("after kill -9 mid-copy, snapshots listed: %v", got)
	}
	if n := h.layers(t); n != 0 {
		t.Errorf("%d layers left by the cut copy", n)
	}
	if _, err := h.api.Create(context.Background(), connect.NewRequest(&sandboxdv1.CreateRequest{Snapshot: "cut", Team: "team-a", Timeout: durationpb.New(time.Minute)})); code(err) != connect.CodeNotFound {
		t.Errorf("a create from the cut snapshot: %v", err)
	}
	// Frozen for the copy, thawed by the recovery.
	if got := h.mustRun(id, token, "root", "echo alive"); got.Stdout != "alive\n" {
		t.Errorf("the sandbox after the recovery: %+v", got)
	}
}
