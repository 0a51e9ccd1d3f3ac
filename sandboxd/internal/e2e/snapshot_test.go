package e2e

import (
	"context"
	"fmt"
	"net/http"
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

// Snapshots of files (native; gVisor with --snapshot-memory=false) and of
// memory too (gVisor): a sandbox restored from an image stands on its
// source's layers, not on the snapshot's own top layer (the image holds
// it), so fewer layers stay in use once the snapshots are deleted.
func TestSnapshots(t *testing.T) {
	t.Run("native", func(t *testing.T) { testSnapshots(t, newHost(t), 3) })
	t.Run("gvisor", func(t *testing.T) { testSnapshots(t, gvisorHost(t), 0) })
	t.Run("gvisor-files", func(t *testing.T) { testSnapshots(t, gvisorHost(t, "--snapshot-memory=false"), 3) })
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

// testSnapshots drives snapshots on h; wantLayers are the layers in use
// once every snapshot is deleted while sandboxes from them run.
func testSnapshots(t *testing.T, h *host, wantLayers int) {
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
	if n := h.layers(t); n != wantLayers {
		t.Errorf("%d layers while sandboxes use them, want %d", n, wantLayers)
	}
	for _, id := range append([]string{aID, bID, cID, d.GetSandbox().GetId(), e.GetSandbox().GetId()}, forks...) {
		if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.layers(t); n != 0 {
		t.Errorf("%d layers left after every user ended", n)
	}
	if n := h.images(t); n != 0 {
		t.Errorf("%d state images left after every snapshot was deleted", n)
	}
}

// Under gVisor a file is copied through the sentry's memory: a snapshot
// that would not fit is refused with the reason, and the sandbox runs on
// (before the check, 1 GiB written under a 512 MiB limit got the sandbox
// OOM-killed).
func TestGvisorSnapshotTooLarge(t *testing.T) {
	h := gvisorHost(t)
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
	t.Run("gvisor", func(t *testing.T) { testKill9DuringSnapshot(t, gvisorHost(t), 400) })
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
	if n := h.images(t); n != 0 {
		t.Errorf("%d state images left by the cut copy", n)
	}
	if _, err := h.api.Create(context.Background(), connect.NewRequest(&sandboxdv1.CreateRequest{Snapshot: "cut", Team: "team-a", Timeout: durationpb.New(time.Minute)})); code(err) != connect.CodeNotFound {
		t.Errorf("a create from the cut snapshot: %v", err)
	}
	// Frozen for the copy, thawed by the recovery.
	if got := h.mustRun(id, token, "root", "echo alive"); got.Stdout != "alive\n" {
		t.Errorf("the sandbox after the recovery: %+v", got)
	}
}

// gvisorHost is a host whose sandboxes run under gVisor.
func gvisorHost(t *testing.T, extra ...string) *host {
	t.Helper()
	runsc := os.Getenv("SKIFF_RUNSC")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
	}
	return newHost(t, append([]string{"--runtime", "gvisor", "--runsc", runsc}, extra...)...)
}

// images is the number of state images on the host.
func (h *host) images(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(h.state, "snapshots", "images"))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// startTicker starts a process in sandbox id that holds a word only in its
// memory (the file it read it from is removed) and writes it with a count
// to /tmp/tick every 100 ms, whole (a new file renamed over it: a reader
// never sees it truncated); the same process, restored elsewhere, goes on
// writing the same word.
func (h *host) startTicker(id, token string) string {
	h.t.Helper()
	word := fmt.Sprintf("word-%d", time.Now().UnixNano())
	h.mustRun(id, token, "root", "echo "+word+` > /tmp/word && setsid sh -c 'w=$(cat /tmp/word); rm /tmp/word; n=0; while :; do n=$((n+1)); echo "$w $n" > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`)
	return word
}

// ticking checks that sandbox id's ticker runs with word: /tmp/tick
// changes and names it, while no file holds the word.
func (h *host) ticking(t *testing.T, id, token, word string) {
	t.Helper()
	var first string
	waitFor(t, 10*time.Second, "the ticker in "+id, func() bool {
		got := h.mustRun(id, token, "root", "cat /tmp/tick; test -e /tmp/word && echo word-file").Stdout
		if !strings.HasPrefix(got, word+" ") || strings.Contains(got, "word-file") {
			t.Fatalf("in %s: %q, want the ticker's %q and no word file", id, got, word)
		}
		if first == "" {
			first = got
			return false
		}
		return got != first
	})
}

// Under gVisor a snapshot and a fork keep the sandbox's memory and
// processes (runsc checkpoint): a sandbox from them runs on from where its
// source was, on its own address and with its own token, and the image
// survives kill -9 of sandboxd and goes with its snapshot.
func TestGvisorMemorySnapshots(t *testing.T) {
	h := gvisorHost(t)
	ctx := context.Background()
	a := h.create(nil)
	aID, aTok := a.GetSandbox().GetId(), a.GetEnvdAccessToken()
	word := h.startTicker(aID, aTok)
	h.startWebServer(aID, aTok)
	h.mustRun(aID, aTok, "root", "mkdir -p /data && echo v1 > /data/f")
	bootA := h.mustRun(aID, aTok, "root", "cat /proc/sys/kernel/random/boot_id").Stdout

	snap := h.snapshot(t, aID, "team-a", "mem")
	if n := h.images(t); n != 1 {
		t.Fatalf("%d state images after a snapshot, want 1", n)
	}
	h.mustRun(aID, aTok, "root", "echo v2 > /data/f")

	b := h.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = snap.GetId() })
	bID, bTok := b.GetSandbox().GetId(), b.GetEnvdAccessToken()
	h.ticking(t, bID, bTok, word)
	if got := h.mustRun(bID, bTok, "root", "cat /data/f; cat /proc/sys/kernel/random/boot_id").Stdout; got != "v1\n"+bootA {
		t.Errorf("in the restored sandbox: %q, want v1 and its source's boot (%q)", got, bootA)
	}
	// Its own address, in its own /etc/hosts, reached through the relay
	// by the web server its source started.
	if got := h.mustRun(bID, bTok, "root", "grep -c "+b.GetSandbox().GetAddress()+" /etc/hosts").Stdout; got != "1\n" {
		t.Errorf("/etc/hosts of the restored sandbox does not name its address %s: %q", b.GetSandbox().GetAddress(), got)
	}
	if got := h.mustRun(bID, bTok, "root", "cat /run/e2b/.E2B_SANDBOX_ID").Stdout; got != bID {
		t.Errorf("/run/e2b/.E2B_SANDBOX_ID of the restored sandbox: %q, want %s", got, bID)
	}
	if status, body := h.relayGet(bID, userPort, "/", nil); status != http.StatusOK || body != "hello\n" {
		t.Errorf("the restored web server: %d %q", status, body)
	}
	// Its own token: the source's opens nothing.
	if _, err := h.run(bID, aTok, "root", "true"); err == nil {
		t.Error("the source's envd token works in the restored sandbox")
	}
	// Independent of its source.
	h.mustRun(bID, bTok, "root", "echo from-b > /data/f")
	if got := h.mustRun(aID, aTok, "root", "cat /data/f").Stdout; got != "v2\n" {
		t.Errorf("the source sees %q after a write in its copy", got)
	}

	// The image survives kill -9 of sandboxd.
	h.kill9()
	h.start()
	c := h.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = "mem" })
	h.ticking(t, c.GetSandbox().GetId(), c.GetEnvdAccessToken(), word)

	// A fork carries the processes as they are now.
	began := time.Now()
	fork, err := h.api.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{SandboxId: aID, Team: "team-a", Count: 2, Timeout: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatalf("fork: %v\n%s", err, h.logTail())
	}
	t.Logf("fork of 2: %s", time.Since(began).Round(time.Millisecond))
	ids := []string{aID, bID, c.GetSandbox().GetId()}
	for _, f := range fork.Msg.GetForks() {
		if f.GetCreated() == nil {
			t.Fatalf("a fork failed: %s %s", f.GetErrorCode(), f.GetErrorMessage())
		}
		id, tok := f.GetCreated().GetSandbox().GetId(), f.GetCreated().GetEnvdAccessToken()
		ids = append(ids, id)
		h.ticking(t, id, tok, word)
		if got := h.mustRun(id, tok, "root", "cat /data/f").Stdout; got != "v2\n" {
			t.Errorf("fork %s has %q, want the source's v2", id, got)
		}
	}
	if n := h.images(t); n != 1 {
		t.Errorf("%d state images after the fork, want the snapshot's only", n)
	}

	if _, err := h.api.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: "mem", Team: "team-a"})); err != nil {
		t.Fatal(err)
	}
	if n := h.images(t); n != 0 {
		t.Errorf("%d state images after the snapshot was deleted", n)
	}
	for _, id := range ids {
		if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.layers(t); n != 0 {
		t.Errorf("%d layers left after every user ended", n)
	}
}
