package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/shared/nodetoken"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Snapshots move sandboxd to sandboxd: host b pulls a's snapshot with a
// ticket made with a's token, verified layer by layer against the digests
// a keeps, and starts sandboxes from it; a layer changed on a's disk after
// it was digested is refused, and a ticket opens one snapshot only.
func TestPullSnapshot(t *testing.T) {
	t.Run("native", func(t *testing.T) { testPullSnapshot(t, newHost(t), newHost(t)) })
	t.Run("gvisor", func(t *testing.T) { testPullSnapshot(t, gvisorHost(t), gvisorHost(t)) })
}

func (h *host) pull(b *host, id, team, ticket string) (*sandboxdv1.PullSnapshotResponse, error) {
	resp, err := b.api.PullSnapshot(context.Background(), connect.NewRequest(&sandboxdv1.PullSnapshotRequest{
		SnapshotId: id, Team: team, SourceUrl: "http://" + h.listen, SourceNode: "host-a", Ticket: ticket,
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// waitDigest waits until h has the digest of a layer (taken in the
// background after a snapshot).
func (h *host) waitDigest(t *testing.T, layer string) {
	t.Helper()
	waitFor(t, 30*time.Second, "the digest of layer "+layer, func() bool {
		_, err := os.Stat(filepath.Join(h.state, "snapshots", "digests", layer))
		return err == nil
	})
}

func testPullSnapshot(t *testing.T, a, b *host) {
	ctx := context.Background()
	c := a.create(nil)
	id, tok := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	a.mustRun(id, tok, "root", "mkdir -p /data && echo pulled > /data/f && head -c 3000000 /dev/urandom > /data/big && sha256sum /data/big > /data/big.sum")
	word := a.startTicker(id, tok)
	snap := a.snapshot(t, id, "team-a", "moving")
	ticket := nodetoken.PullTicket(a.token, snap.GetId(), time.Now().Add(time.Minute))

	// Another team, and another snapshot's ticket, get nothing.
	if _, err := a.pull(b, snap.GetId(), "team-b", ticket); code(err) != connect.CodeNotFound {
		t.Errorf("team-b's pull: %v", err)
	}
	if _, err := a.pull(b, snap.GetId(), "team-a", nodetoken.PullTicket(a.token, "aaaaaaaaaaaaaaaatag1", time.Now().Add(time.Minute))); err == nil {
		t.Error("a pull with another snapshot's ticket worked")
	}
	if _, err := a.pull(b, snap.GetId(), "team-a", nodetoken.PullTicket(b.token, snap.GetId(), time.Now().Add(time.Minute))); err == nil {
		t.Error("a pull with a ticket of another host's token worked")
	}

	began := time.Now()
	got, err := a.pull(b, snap.GetId(), "team-a", ticket)
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, b.logTail())
	}
	t.Logf("pulled %d bytes in %s (memory: %v)", got.GetFetchedBytes(), time.Since(began).Round(time.Millisecond), got.GetSnapshot().GetMemory())
	if got.GetSnapshot().GetId() != snap.GetId() || got.GetSnapshot().GetPulledFrom() != "host-a" || got.GetFetchedBytes() < 3000000 {
		t.Errorf("pulled %v, %d bytes", got.GetSnapshot(), got.GetFetchedBytes())
	}
	if got.GetSnapshot().GetMemory() != snap.GetMemory() {
		t.Errorf("memory %v on the puller, %v on the holder (the same runtime)", got.GetSnapshot().GetMemory(), snap.GetMemory())
	}
	// Again: nothing to fetch.
	if again, err := a.pull(b, snap.GetId(), "team-a", ticket); err != nil || again.GetFetchedBytes() != 0 {
		t.Errorf("a second pull: %v, %d bytes", err, again.GetFetchedBytes())
	}
	// b starts sandboxes from it, with its files, and lists it.
	d := b.create(func(r *sandboxdv1.CreateRequest) { r.Snapshot = "moving" })
	if out := b.mustRun(d.GetSandbox().GetId(), d.GetEnvdAccessToken(), "root", "cat /data/f && sha256sum -c /data/big.sum >/dev/null && echo intact").Stdout; out != "pulled\nintact\n" {
		t.Errorf("in a sandbox from the pulled snapshot: %q", out)
	}
	if snap.GetMemory() {
		// Restored on another host: its processes and memory too.
		b.ticking(t, d.GetSandbox().GetId(), d.GetEnvdAccessToken(), word)
	}
	if ids := b.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(ids) != 1 || ids[0] != snap.GetId() {
		t.Errorf("b lists %v", ids)
	}
	// b survives its own kill -9 with the pulled snapshot.
	b.kill9()
	b.start()
	if ids := b.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(ids) != 1 {
		t.Errorf("after kill -9, b lists %v", ids)
	}

	// A layer changed on the holder's disk after its digest was taken.
	a.mustRun(id, tok, "root", "echo second > /data/g")
	snap2 := a.snapshot(t, id, "team-a", "")
	var layerDir string
	entries, _ := os.ReadDir(filepath.Join(a.state, "snapshots", "layers"))
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(a.state, "snapshots", "layers", e.Name(), "data", "g")); err == nil {
			layerDir = filepath.Join(a.state, "snapshots", "layers", e.Name())
		}
	}
	if layerDir == "" {
		t.Fatal("no layer of a holds /data/g")
	}
	a.waitDigest(t, filepath.Base(layerDir))
	if err := os.WriteFile(filepath.Join(layerDir, "data", "g"), []byte("tampered\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = a.pull(b, snap2.GetId(), "team-a", nodetoken.PullTicket(a.token, snap2.GetId(), time.Now().Add(time.Minute)))
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Errorf("a pull of a tampered layer: %v, want a digest mismatch", err)
	}
	if ids := b.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(ids) != 1 {
		t.Errorf("after the refused pull, b lists %v", ids)
	}
	for _, e := range mustReadDir(t, filepath.Join(b.state, "snapshots", "layers")) {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("the refused pull left %s", e.Name())
		}
	}
	if _, err := b.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: d.GetSandbox().GetId()})); err != nil {
		t.Fatal(err)
	}
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// kill -9 of the puller in the middle of a pull: its next start lists no
// snapshot and keeps nothing of what it fetched; a pull then works.
func TestKill9DuringPull(t *testing.T) {
	a, b := newHost(t), newHost(t)
	c := a.create(func(r *sandboxdv1.CreateRequest) { r.Resources.DiskMib = 2048 })
	id, tok := c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	a.mustRun(id, tok, "root", "dd if=/dev/urandom of=/big bs=1048576 count=600 2>/dev/null && echo ok")
	snap := a.snapshot(t, id, "team-a", "big")
	ticket := nodetoken.PullTicket(a.token, snap.GetId(), time.Now().Add(5*time.Minute))
	done := make(chan error, 1)
	go func() {
		_, err := a.pull(b, snap.GetId(), "team-a", ticket)
		done <- err
	}()
	waitFor(t, 60*time.Second, "the pull to start writing", func() bool {
		entries, _ := os.ReadDir(filepath.Join(b.state, "snapshots", "layers"))
		return len(entries) > 0
	})
	b.kill9()
	if err := <-done; err == nil {
		t.Fatal("the pull finished before the kill: make the snapshot bigger")
	}
	b.start()
	if ids := b.listSnapshots(t, &sandboxdv1.ListSnapshotsRequest{Team: "team-a"}); len(ids) != 0 {
		t.Errorf("after kill -9 mid-pull, b lists %v", ids)
	}
	if n := b.layers(t); n != 0 {
		t.Errorf("%d layers left by the cut pull", n)
	}
	if got, err := a.pull(b, snap.GetId(), "team-a", ticket); err != nil || got.GetFetchedBytes() < 600<<20 {
		t.Fatalf("the pull after the restart: %v, %d bytes", err, got.GetFetchedBytes())
	}
}
