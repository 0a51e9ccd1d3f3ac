package service

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// TestRecover restarts sandboxd over the same state directory, runtime and
// network: the sandboxes the runtime still has are re-adopted as they were,
// the gone one is cleaned up, the orphans are stopped, and deadlines fire
// again (one that passed while sandboxd was down at once).
func TestRecover(t *testing.T) {
	dir := t.TempDir()
	n := servicetest.NewNetwork()
	rt := servicetest.NewRuntime(t, n)
	a := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt})
	c := a.clock

	run := a.create(func(m *pb.CreateRequest) {
		m.Metadata = map[string]string{"k": "v"}
		m.Timeout = durationpb.New(10 * time.Minute)
	}).GetSandbox().GetId()
	paused := a.create().GetSandbox().GetId()
	if _, err := a.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: paused})); err != nil {
		t.Fatal(err)
	}
	gone := a.create().GetSandbox().GetId()
	past := a.create(func(m *pb.CreateRequest) { m.Timeout = durationpb.New(time.Minute) }).GetSandbox().GetId()
	warm := a.warm(1)[0]
	before := map[string]*pb.Sandbox{}
	tokens := map[string]string{}
	for _, id := range []string{run, paused, warm} {
		before[id], _ = a.get(id)
		rec, _ := a.reg.Get(id)
		tokens[id] = rec.EnvdAccessToken
	}
	a.stop()

	// While sandboxd is down: one sandbox dies, the paused one is found
	// running (a crash mid-pause), leftovers of an unrecorded create
	// appear, and two minutes pass.
	rt.SetStatus(gone, sandboxrt.Stopped)
	rt.SetStatus(paused, sandboxrt.Running)
	const orphanRT, orphanNet = "orphan0000000000rt00", "orphan000000000net00"
	rt.SetStatus(orphanRT, sandboxrt.Running)
	n.AddOrphan(orphanNet)
	c.Step(2 * time.Minute)

	b := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt, clock: c})
	for _, id := range []string{run, paused, warm} {
		got, err := b.get(id)
		if err != nil {
			t.Fatalf("%s not re-adopted: %v", id, err)
		}
		if !sameSandbox(got, before[id]) {
			t.Fatalf("re-adopted %s = %v, was %v", id, got, before[id])
		}
		if rec, _ := b.reg.Get(id); rec.EnvdAccessToken != tokens[id] {
			t.Fatalf("%s lost its token", id)
		}
	}
	if at, ok := b.svc.deadlines.Deadline(run); !ok || !at.Equal(before[run].GetEndAt().AsTime()) {
		t.Fatalf("deadline of %s = %v %v, want %v", run, at, ok, before[run].GetEndAt().AsTime())
	}
	for _, id := range []string{paused, warm} {
		if _, ok := b.svc.deadlines.Deadline(id); ok {
			t.Fatalf("%s has a deadline", id)
		}
	}
	if st, _ := rt.Status(t.Context(), paused); st != sandboxrt.Paused {
		t.Fatalf("recorded-paused sandbox is %s in the runtime, want paused", st)
	}
	if !b.gone(gone) || !rt.WasStopped(gone) || n.Has(gone) {
		t.Fatalf("gone sandbox: record gone %v, stopped %v, network left %v", b.gone(gone), rt.WasStopped(gone), n.Has(gone))
	}
	eventually(t, "the deadline that passed while down to fire", func() bool { return b.gone(past) })
	if rt.Running(orphanRT) || n.Has(orphanNet) {
		t.Fatal("orphans were left running")
	}

	// The re-adopted addresses are taken: a new sandbox gets another.
	taken := map[string]bool{}
	for _, id := range []string{run, paused, warm} {
		rec, _ := b.reg.Get(id)
		taken[rec.Address] = true
		if _, err := b.pool.Claim("intruder", netip.MustParseAddr(rec.Address)); err == nil {
			t.Fatalf("address of %s is free after recovery", id)
		}
	}
	fresh := b.create().GetSandbox().GetId()
	if rec, _ := b.reg.Get(fresh); taken[rec.Address] {
		t.Fatalf("new sandbox got re-adopted address %s", rec.Address)
	}

	// The re-armed deadline kills at the recorded time.
	c.Step(8 * time.Minute)
	eventually(t, "the re-armed deadline to fire", func() bool { return b.gone(run) })
}

func sameSandbox(a, b *pb.Sandbox) bool {
	return a.GetId() == b.GetId() && a.GetState() == b.GetState() && a.GetTeam() == b.GetTeam() &&
		maps.Equal(a.GetMetadata(), b.GetMetadata()) && a.GetStartedAt().AsTime().Equal(b.GetStartedAt().AsTime()) &&
		a.GetEndAt().AsTime().Equal(b.GetEndAt().AsTime()) && a.GetPool() == b.GetPool()
}

// TestRecoverLeavesUnreadable keeps a sandbox whose status the runtime
// cannot read: a passing error must not cost it.
func TestRecoverLeavesUnreadable(t *testing.T) {
	dir := t.TempDir()
	n := servicetest.NewNetwork()
	rt := servicetest.NewRuntime(t, n)
	a := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt})
	id := a.create().GetSandbox().GetId()
	a.stop()
	b := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt, clock: a.clock,
		wrap: func(r *servicetest.Runtime) sandboxrt.Runtime { return &statusFails{r} }})
	if _, err := b.get(id); err != nil {
		t.Fatalf("sandbox dropped on a status error: %v", err)
	}
	if rec, _ := b.reg.Get(id); rec.State != registry.StateRunning {
		t.Fatalf("state = %s", rec.State)
	}
}

type statusFails struct{ *servicetest.Runtime }

func (s *statusFails) Status(context.Context, string) (sandboxrt.Status, error) {
	return sandboxrt.Stopped, errors.New("cgroup unreadable")
}

// TestRecoverFilesOnlyNetworkLeft: a sandboxd killed while it stopped a
// sandbox paused with its files only, after the runtime's stop and before
// the network's teardown, left the network; the next start tears it down,
// so that the sandbox's next boot can set up its own.
func TestRecoverFilesOnlyNetworkLeft(t *testing.T) {
	dir := t.TempDir()
	n := servicetest.NewNetwork()
	rt := servicetest.NewRuntime(t, n)
	wrap := func(r *servicetest.Runtime) sandboxrt.Runtime { return withSnapshots(r) }
	a := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt, snapshots: true, wrap: wrap})
	id := a.create().GetSandbox().GetId()
	a.pause(id, true)
	a.stop()
	if rt.Running(id) || n.Has(id) {
		t.Fatalf("a sandbox paused with its files only: runtime %v, network %v", rt.Running(id), n.Has(id))
	}
	if _, err := n.Setup(t.Context(), id, ipam.Block{}, true); err != nil {
		t.Fatal(err)
	}

	b := newHarness(t, harnessConfig{dir: dir, net: n, rt: rt, clock: a.clock, snapshots: true, wrap: wrap})
	if n.Has(id) {
		t.Error("recovery left the network of a sandbox paused with its files only")
	}
	resp, err := b.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id}))
	if err != nil {
		t.Fatalf("Resume after recovery: %v", err)
	}
	if resp.Msg.GetSandbox().GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING || !rt.Running(id) || !n.Has(id) {
		t.Fatalf("resumed sandbox = %v; runtime %v, network %v", resp.Msg.GetSandbox(), rt.Running(id), n.Has(id))
	}
}
