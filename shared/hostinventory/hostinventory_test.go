package hostinventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// fakeSandboxd serves Info and a Watch stream the test drives: each stream
// sends the current snapshot, then whatever the test pushes, until the test
// breaks it.
type fakeSandboxd struct {
	sandboxdv1connect.UnimplementedSandboxdServiceHandler
	mu        sync.Mutex
	info      *pb.InfoResponse
	sandboxes []*pb.Sandbox
	events    chan *pb.WatchResponse
	breaks    chan struct{}
	streams   int
	down      bool // Watch refuses, as a sandboxd that is not up
	// beforeSnapshot, when set, runs in Watch before the snapshot is sent.
	beforeSnapshot func()
	// infoHeld, when set, holds the next Info's answer, read before it
	// waits, until it is closed.
	infoHeld chan struct{}
}

func (f *fakeSandboxd) Info(context.Context, *connect.Request[pb.InfoRequest]) (*connect.Response[pb.InfoResponse], error) {
	f.mu.Lock()
	info, held := f.info, f.infoHeld
	f.infoHeld = nil
	f.mu.Unlock()
	if held != nil {
		<-held
	}
	return connect.NewResponse(info), nil
}

func (f *fakeSandboxd) Watch(ctx context.Context, _ *connect.Request[pb.WatchRequest], s *connect.ServerStream[pb.WatchResponse]) error {
	f.mu.Lock()
	if f.down {
		f.mu.Unlock()
		return connect.NewError(connect.CodeUnavailable, errors.New("down"))
	}
	f.streams++
	snap := &pb.WatchResponse{Event: &pb.WatchResponse_Snapshot_{Snapshot: &pb.WatchResponse_Snapshot{Sandboxes: f.sandboxes}}}
	before := f.beforeSnapshot
	f.mu.Unlock()
	if before != nil {
		before()
	}
	if err := s.Send(snap); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.breaks:
			return connect.NewError(connect.CodeUnavailable, errors.New("sandboxd restarting"))
		case ev := <-f.events:
			if err := s.Send(ev); err != nil {
				return err
			}
		}
	}
}

func sandbox(id, state string) *pb.Sandbox {
	st := map[string]pb.SandboxState{"running": pb.SandboxState_SANDBOX_STATE_RUNNING, "paused": pb.SandboxState_SANDBOX_STATE_PAUSED, "warm": pb.SandboxState_SANDBOX_STATE_WARM}[state]
	sb := &pb.Sandbox{
		Id: id, Template: "base", State: st, Team: "team-a",
		StartedAt: timestamppb.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)),
		EndAt:     timestamppb.New(time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)),
		Resources: &pb.Resources{CpuMilli: 1000, MemoryMib: 256},
		Metadata:  map[string]string{"k": "v"},
	}
	if state == "warm" {
		sb.Team, sb.Pool = "", "ns/pool"
	}
	return sb
}

func start(t *testing.T, f *fakeSandboxd) *Host {
	t.Helper()
	return startWith(t, f, 50*time.Millisecond)
}

// startWith starts a mirror of f that asks Info every infoEvery.
func startWith(t *testing.T, f *fakeSandboxd, infoEvery time.Duration) *Host {
	t.Helper()
	f.events, f.breaks = make(chan *pb.WatchResponse, 16), make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h := New(sandboxdv1connect.NewSandboxdServiceClient(srv.Client(), srv.URL), "10.0.0.1:27777",
		Options{InfoInterval: infoEvery, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v", err)
		}
	})
	return h
}

// eventually polls the mirror until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestMirrorFollowsSnapshotAndChanges(t *testing.T) {
	f := &fakeSandboxd{
		info: &pb.InfoResponse{NodeName: "host-1", Capacity: &pb.Resources{CpuMilli: 8000, MemoryMib: 16384}, MaxSandboxes: 64,
			Templates: []*pb.TemplateVersion{{Name: "python", Version: "b"}, {Name: "base", Version: "a"}}},
		sandboxes: []*pb.Sandbox{sandbox("bbbbbbbbbbbbbbbbtag1", "running"), sandbox("aaaaaaaaaaaaaaaatag1", "warm")},
	}
	h := start(t, f)
	eventually(t, "the snapshot", func() bool { ok, _ := h.Synced(); return ok })
	inv, err := h.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if inv.Name != "host-1" || inv.Spec.Endpoint != "10.0.0.1:27777" || inv.PublishedAt != nil {
		t.Errorf("object: %+v", inv.ObjectMeta)
	}
	s := inv.Spec
	if s.Capacity != (v1beta1.NodeCapacity{CPUMilli: 8000, MemoryMiB: 16384, Sandboxes: 64}) ||
		s.Allocated != (v1beta1.NodeCapacity{CPUMilli: 2000, MemoryMiB: 512, Sandboxes: 2}) {
		t.Errorf("capacity %+v allocated %+v", s.Capacity, s.Allocated)
	}
	if len(s.Templates) != 2 || s.Templates[0].Name != "base" {
		t.Errorf("templates not sorted: %+v", s.Templates)
	}
	if len(s.Sandboxes) != 2 || s.Sandboxes[0].ID != "aaaaaaaaaaaaaaaatag1" || s.Sandboxes[0].State != v1beta1.SandboxWarm || s.Sandboxes[1].Metadata["k"] != "v" || s.Sandboxes[1].EndAt == nil {
		t.Errorf("sandboxes: %+v", s.Sandboxes)
	}
	if len(s.Pools) != 1 || s.Pools[0] != (v1beta1.PoolSummary{Pool: "ns/pool", Template: "base", Warm: 1}) {
		t.Errorf("pools: %+v", s.Pools)
	}
	raw, err := h.Sandboxes()
	if err != nil || len(raw) != 2 || raw[0].GetId() != "aaaaaaaaaaaaaaaatag1" || raw[1].GetMetadata()["k"] != "v" {
		t.Errorf("Sandboxes() = %v, %v", raw, err)
	}
	raw[1].Metadata["k"] = "changed" // a copy: the mirror keeps its own
	if again, _ := h.Sandboxes(); again[1].GetMetadata()["k"] != "v" {
		t.Error("Sandboxes() returned the mirror's own messages")
	}

	// A change and a deletion arrive on the stream.
	f.events <- &pb.WatchResponse{Event: &pb.WatchResponse_Change_{Change: &pb.WatchResponse_Change{Type: pb.WatchResponse_CHANGE_TYPE_UPSERTED, Sandbox: sandbox("aaaaaaaaaaaaaaaatag1", "paused")}}}
	f.events <- &pb.WatchResponse{Event: &pb.WatchResponse_Change_{Change: &pb.WatchResponse_Change{Type: pb.WatchResponse_CHANGE_TYPE_DELETED, Sandbox: &pb.Sandbox{Id: "bbbbbbbbbbbbbbbbtag1"}}}}
	eventually(t, "the changes", func() bool {
		inv, err := h.Inventory()
		return err == nil && len(inv.Spec.Sandboxes) == 1 && inv.Spec.Sandboxes[0].State == v1beta1.SandboxPaused && inv.Spec.Allocated.Sandboxes == 1
	})
	if why := h.Ended("bbbbbbbbbbbbbbbbtag1"); why != "" {
		t.Errorf("a killed sandbox ended %q", why)
	}
	// A sandbox that died: the mirror keeps why its delete said.
	f.events <- &pb.WatchResponse{Event: &pb.WatchResponse_Change_{Change: &pb.WatchResponse_Change{
		Type: pb.WatchResponse_CHANGE_TYPE_DELETED, Sandbox: &pb.Sandbox{Id: "aaaaaaaaaaaaaaaatag1"}, Ended: "the sandbox died: oom"}}}
	eventually(t, "the ending", func() bool { return h.Ended("aaaaaaaaaaaaaaaatag1") == "the sandbox died: oom" })
}

// The mirror forgets the oldest endings past maxEnded.
func TestEndingsAreBounded(t *testing.T) {
	h := &Host{}
	for i := range maxEnded + 10 {
		h.rememberEndedLocked(fmt.Sprintf("id-%d", i), "why")
	}
	if len(h.ended) != maxEnded || h.Ended("id-0") != "" || h.Ended(fmt.Sprintf("id-%d", maxEnded+9)) != "why" {
		t.Errorf("%d endings kept; the oldest %q, the newest %q", len(h.ended), h.Ended("id-0"), h.Ended(fmt.Sprintf("id-%d", maxEnded+9)))
	}
}

func TestMirrorLosesSyncWhenTheStreamBreaksAndComesBack(t *testing.T) {
	f := &fakeSandboxd{info: &pb.InfoResponse{NodeName: "host-2"}, sandboxes: []*pb.Sandbox{sandbox("aaaaaaaaaaaaaaaatag2", "running")}}
	h := start(t, f)
	eventually(t, "the snapshot", func() bool { ok, _ := h.Synced(); return ok })
	// sandboxd goes away; meanwhile a sandbox comes.
	f.mu.Lock()
	f.down = true
	f.sandboxes = append(f.sandboxes, sandbox("bbbbbbbbbbbbbbbbtag2", "running"))
	f.mu.Unlock()
	f.breaks <- struct{}{}
	// Readers never get the mirror of a host they cannot hear.
	eventually(t, "the mirror to lose sync", func() bool {
		_, err := h.Inventory()
		return errors.Is(err, ErrNotSynced)
	})
	time.Sleep(30 * time.Millisecond) // a few reconnect attempts, all refused
	if _, err := h.Inventory(); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("in sync while sandboxd refuses: %v", err)
	}
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	eventually(t, "a second stream with the new snapshot", func() bool {
		inv, err := h.Inventory()
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.streams >= 2 && err == nil && len(inv.Spec.Sandboxes) == 2
	})
}

func TestMirrorIsNotSyncedWithoutAHost(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens there any more
	h := New(sandboxdv1connect.NewSandboxdServiceClient(http.DefaultClient, srv.URL), "x:1", Options{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v", err)
	}
	if _, err := h.Inventory(); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("Inventory of an unreachable host: %v", err)
	}
	if _, err := h.Sandboxes(); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("Sandboxes of an unreachable host: %v", err)
	}
	if ok, err := h.Synced(); ok || err == nil {
		t.Errorf("Synced = %v, %v; want false with the cause", ok, err)
	}
}

func TestInfoIsAskedAgain(t *testing.T) {
	f := &fakeSandboxd{info: &pb.InfoResponse{NodeName: "host-3"}}
	h := start(t, f)
	eventually(t, "the snapshot", func() bool { ok, _ := h.Synced(); return ok })
	f.mu.Lock()
	f.info = &pb.InfoResponse{NodeName: "host-3", Templates: []*pb.TemplateVersion{{Name: "new", Version: "1"}}}
	f.mu.Unlock()
	eventually(t, "the new template", func() bool {
		inv, err := h.Inventory()
		return err == nil && len(inv.Spec.Templates) == 1 && inv.Spec.Templates[0].Name == "new"
	})
}

// A host that says its Info changed (a snapshot taken) is asked again at
// once, not at the next InfoInterval.
func TestHostChangedAsksInfoAtOnce(t *testing.T) {
	f := &fakeSandboxd{info: &pb.InfoResponse{NodeName: "host-5"}}
	h := startWith(t, f, time.Hour)
	eventually(t, "the snapshot", func() bool { ok, _ := h.Synced(); return ok })
	f.mu.Lock()
	f.info = &pb.InfoResponse{NodeName: "host-5", Snapshots: []*pb.Snapshot{{Id: "snapaaaaaaaaaaaatag5", Team: "team-a"}}}
	f.mu.Unlock()
	f.events <- &pb.WatchResponse{Event: &pb.WatchResponse_HostChanged_{HostChanged: &pb.WatchResponse_HostChanged{}}}
	eventually(t, "the snapshot in the inventory", func() bool {
		inv, err := h.Inventory()
		return err == nil && len(inv.Spec.Snapshots) == 1 && inv.Spec.Snapshots[0].ID == "snapaaaaaaaaaaaatag5"
	})
}

// A change to the host made before the stream starts, so announced on no
// stream, is in the inventory without waiting for InfoInterval: Info is
// asked once the snapshot is in.
func TestChangeBeforeTheStreamIsSeen(t *testing.T) {
	f := &fakeSandboxd{info: &pb.InfoResponse{NodeName: "host-6"}}
	f.beforeSnapshot = func() {
		f.mu.Lock()
		f.info = &pb.InfoResponse{NodeName: "host-6", DiskPressure: true}
		f.mu.Unlock()
	}
	h := startWith(t, f, time.Hour)
	eventually(t, "the pressure in the inventory", func() bool {
		inv, err := h.Inventory()
		return err == nil && inv.Spec.DiskPressure
	})
}

// An Info answer that lands after the answer to a later call is older,
// and not kept.
func TestOlderInfoAnswerDropped(t *testing.T) {
	held := make(chan struct{})
	f := &fakeSandboxd{info: &pb.InfoResponse{NodeName: "host-7"}, infoHeld: held}
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h := New(sandboxdv1connect.NewSandboxdServiceClient(srv.Client(), srv.URL), "10.0.0.1:27777", Options{})
	first := make(chan error, 1)
	go func() { first <- h.refreshInfo(t.Context()) }()
	eventually(t, "the first call to be held", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.infoHeld == nil
	})
	f.mu.Lock()
	f.info = &pb.InfoResponse{NodeName: "host-7", DiskPressure: true}
	f.mu.Unlock()
	if err := h.refreshInfo(t.Context()); err != nil {
		t.Fatal(err)
	}
	close(held)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.info.GetDiskPressure() {
		t.Fatal("the first call's older answer replaced the second's")
	}
}

func TestFeedAppliesAndRemoves(t *testing.T) {
	f := &fakeSandboxd{info: &pb.InfoResponse{NodeName: "host-4"}, sandboxes: []*pb.Sandbox{sandbox("aaaaaaaaaaaaaaaatag4", "running")}}
	h := start(t, f)
	src := inventory.NewStaticSource()
	ctx, cancel := context.WithCancel(context.Background())
	fed := make(chan struct{})
	go func() {
		Feed(ctx, h, src, time.Now)
		close(fed)
	}()
	inSource := func() int {
		nodes, _ := src.ListNodes(context.Background())
		if len(nodes) == 1 && nodes[0].PublishedAt == nil {
			t.Error("applied without publishedAt")
		}
		return len(nodes)
	}
	eventually(t, "the host in the source", func() bool { return inSource() == 1 })
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	f.breaks <- struct{}{}
	eventually(t, "the host to leave the source", func() bool { return inSource() == 0 })
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
	eventually(t, "the host back in the source", func() bool { return inSource() == 1 })
	cancel()
	<-fed
	if inSource() != 0 {
		t.Error("the host stayed in the source after Feed ended")
	}
}

// TestSpecEnvdVersionAndDisk: the node carries its envd version, an entry
// only its own when it differs (a sandbox from before an envd upgrade), and
// every entry its disk.
func TestSpecEnvdVersionAndDisk(t *testing.T) {
	info := &pb.InfoResponse{EnvdVersion: "0.6.4", Capacity: &pb.Resources{CpuMilli: 4000, MemoryMib: 8192}, MaxSandboxes: 8}
	sbs := []*pb.Sandbox{
		{Id: "a0000000000000000000", Template: "base", Team: "t", EnvdVersion: "0.6.4", Resources: &pb.Resources{CpuMilli: 1000, MemoryMib: 512, DiskMib: 10240}},
		{Id: "b0000000000000000000", Template: "base", Team: "t", EnvdVersion: "0.6.3", Resources: &pb.Resources{CpuMilli: 1000, MemoryMib: 512}},
	}
	spec := Spec("10.0.0.1:27777", info, sbs)
	if spec.EnvdVersion != "0.6.4" || len(spec.Sandboxes) != 2 || spec.CPUAdmission != v1beta1.CPUReserved {
		t.Fatalf("spec: %+v", spec)
	}
	info.CpuShared = true
	if spec := Spec("10.0.0.1:27777", info, sbs); spec.CPUAdmission != v1beta1.CPUShared || spec.Capacity.CPUMilli != 4000 {
		t.Fatalf("a host that shares its CPU: admission %q, capacity %+v", spec.CPUAdmission, spec.Capacity)
	}
	if e := spec.Sandboxes[0]; e.EnvdVersion != "" || e.DiskMiB != 10240 {
		t.Errorf("an entry with the node's envd: version %q (want none), disk %d", e.EnvdVersion, e.DiskMiB)
	}
	if e := spec.Sandboxes[1]; e.EnvdVersion != "0.6.3" || e.DiskMiB != 0 {
		t.Errorf("an entry with an older envd: version %q, disk %d", e.EnvdVersion, e.DiskMiB)
	}
}

// An entry's times are sandboxd's to the microsecond, as the inventory's
// JSON keeps them: the entry a reader decodes is the one Entry made.
func TestEntryTimesInMicroseconds(t *testing.T) {
	start := time.Date(2026, 11, 29, 12, 0, 0, 320_456_789, time.UTC)
	e := Entry(&pb.Sandbox{Id: "a0000000000000000000", Template: "base", Team: "t",
		StartedAt: timestamppb.New(start), EndAt: timestamppb.New(start.Add(time.Hour))})
	want := start.Truncate(time.Microsecond)
	if !e.StartedAt.Time.Equal(want) || e.EndAt == nil || !e.EndAt.Time.Equal(want.Add(time.Hour)) {
		t.Fatalf("entry times %v, %v; want %v and an hour later", e.StartedAt, e.EndAt, want)
	}
	raw, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var back v1beta1.SandboxEntry
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(back, e) {
		t.Errorf("through JSON %+v, want %+v", back, e)
	}
}

// A host's snapshots are in its inventory, by ID, and past the bound the
// newest are kept (sandboxd lists them newest first).
func TestSpecSnapshots(t *testing.T) {
	info := &pb.InfoResponse{}
	for i := range v1beta1.MaxInventorySnapshots + 5 {
		info.Snapshots = append(info.Snapshots, &pb.Snapshot{Id: fmt.Sprintf("s%019d", i), Team: "t", Name: "n", Tag: "default", Memory: i%2 == 0, PulledFrom: "host-a"})
	}
	spec := Spec("10.0.0.1:27777", info, nil)
	if len(spec.Snapshots) != v1beta1.MaxInventorySnapshots {
		t.Fatalf("%d snapshots listed, want %d", len(spec.Snapshots), v1beta1.MaxInventorySnapshots)
	}
	if got := spec.Snapshots[0]; got != (v1beta1.SnapshotEntry{ID: "s0000000000000000000", Team: "t", Name: "n", Tag: "default", Memory: true, PulledFrom: "host-a"}) {
		t.Errorf("first entry %+v", got)
	}
	if last := spec.Snapshots[len(spec.Snapshots)-1].ID; last != fmt.Sprintf("s%019d", v1beta1.MaxInventorySnapshots-1) {
		t.Errorf("the newest %d kept, but the last is %s", v1beta1.MaxInventorySnapshots, last)
	}
}

// An envd version longer than the schema holds (a record written before
// sandboxd checked what a restored sandbox's port answered) leaves the
// entry with none, the node's, rather than making an entry every reader
// drops; one within the bound stays.
func TestEntryDropsAVersionPastItsBound(t *testing.T) {
	for version, want := range map[string]string{
		"0.6.13":                 "0.6.13",
		strings.Repeat("é", 32):  strings.Repeat("é", 32),
		strings.Repeat("9", 33):  "",
		strings.Repeat("1", 1e5): "",
	} {
		e := Entry(&pb.Sandbox{Id: "a0000000000000000000", Template: "base", Team: "t", EnvdVersion: version, StartedAt: timestamppb.Now()})
		if e.EnvdVersion != want {
			t.Errorf("version of %d characters: entry has %q, want %q", len([]rune(version)), e.EnvdVersion, want)
		}
		if err := e.Validate(); err != nil {
			t.Errorf("version of %d characters: %v", len([]rune(version)), err)
		}
	}
}
