package service

import (
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

func TestKill(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	sb := h.create().GetSandbox()
	id := sb.GetId()
	logPath := filepath.Join(h.dir, "logs", id+".log")
	if _, err := os.Stat(logPath); err != nil {
		t.Fatalf("log: %v", err)
	}
	if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if h.rt.Running(id) || h.net.Has(id) || !h.gone(id) {
		t.Fatalf("after kill: running %v, network %v, record gone %v", h.rt.Running(id), h.net.Has(id), h.gone(id))
	}
	if _, ok := h.svc.deadlines.Deadline(id); ok {
		t.Fatal("deadline still armed")
	}
	if _, err := os.Stat(logPath); !os.IsNotExist(err) {
		t.Fatalf("log still there: %v", err)
	}
	// The address is free: another owner can claim it.
	if _, err := h.pool.Claim("other", netip.MustParseAddr("127.213.0.2")); err != nil {
		t.Fatalf("address still held: %v", err)
	}
	h.pool.Release("other")
	h.assertNothingHeld()

	_, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: "../etc"}))
	wantCode(t, err, connect.CodeInvalidArgument, "sandbox_id")
}

func TestPauseResume(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create().GetSandbox().GetId() // endAt = epoch + 5m
	pause := func() (*pb.Sandbox, error) {
		resp, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.GetSandbox(), nil
	}
	resume := func(timeout *durationpb.Duration) (*pb.Sandbox, error) {
		resp, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Timeout: timeout}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.GetSandbox(), nil
	}

	_, err := resume(nil)
	wantCode(t, err, connect.CodeFailedPrecondition, "not paused")

	h.clock.Step(time.Minute) // 4 minutes left
	sb, err := pause()
	if err != nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_PAUSED || !sb.GetPausedAt().AsTime().Equal(epoch.Add(time.Minute)) ||
		!sb.GetEndAt().AsTime().Equal(epoch.Add(5*time.Minute)) {
		t.Fatalf("Pause = %v, %v; want it paused at epoch + 1m, its deadline kept", sb, err)
	}
	if st, _ := h.rt.Status(t.Context(), id); st.String() != "paused" {
		t.Fatalf("runtime status %s", st)
	}
	if _, ok := h.svc.deadlines.Deadline(id); ok {
		t.Fatal("a paused sandbox has an armed deadline")
	}
	_, err = pause()
	wantCode(t, err, connect.CodeFailedPrecondition, "not running")
	_, err = h.client.SetTimeout(t.Context(), connect.NewRequest(&pb.SetTimeoutRequest{SandboxId: id, Timeout: durationpb.New(time.Minute)}))
	wantCode(t, err, connect.CodeFailedPrecondition, "paused")

	// Paused time does not count: resuming an hour later leaves 4 minutes.
	h.clock.Step(time.Hour)
	sb, err = resume(nil)
	if err != nil || sb.GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING || sb.GetPausedAt() != nil {
		t.Fatalf("Resume = %v, %v", sb, err)
	}
	want := epoch.Add(time.Minute + time.Hour + 4*time.Minute)
	if got := sb.GetEndAt().AsTime(); !got.Equal(want) {
		t.Fatalf("endAt = %v, want %v", got, want)
	}
	if at, ok := h.svc.deadlines.Deadline(id); !ok || !at.Equal(want) {
		t.Fatalf("deadline = %v %v, want %v", at, ok, want)
	}
	_, err = resume(nil)
	wantCode(t, err, connect.CodeFailedPrecondition, "not paused")

	// With a timeout, the lifetime starts afresh.
	if _, err := pause(); err != nil {
		t.Fatal(err)
	}
	_, err = resume(durationpb.New(48 * time.Hour))
	wantCode(t, err, connect.CodeInvalidArgument, "timeout:")
	sb, err = resume(durationpb.New(30 * time.Minute))
	if err != nil || !sb.GetEndAt().AsTime().Equal(h.clock.Now().Add(30*time.Minute)) {
		t.Fatalf("Resume with timeout = %v, %v", sb, err)
	}

	_, err = h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: "aaaaaaaaaaaaaaaaaaaa"}))
	wantCode(t, err, connect.CodeNotFound)
}

func TestSetTimeout(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create().GetSandbox().GetId() // endAt = epoch + 5m
	resp, err := h.client.SetTimeout(t.Context(), connect.NewRequest(&pb.SetTimeoutRequest{SandboxId: id, Timeout: durationpb.New(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.GetSandbox().GetEndAt().AsTime(); !got.Equal(epoch.Add(time.Hour)) {
		t.Fatalf("endAt = %v", got)
	}
	// The old deadline passes: nothing happens. The new one kills.
	h.clock.Step(10 * time.Minute)
	if _, err := h.get(id); err != nil {
		t.Fatalf("killed at the old deadline: %v", err)
	}
	h.clock.Step(time.Hour)
	eventually(t, "kill at the new deadline", func() bool { return h.gone(id) })

	for _, tc := range []struct {
		name    string
		timeout *durationpb.Duration
	}{{"missing", nil}, {"negative", durationpb.New(-time.Second)}, {"too long", durationpb.New(25 * time.Hour)}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.SetTimeout(t.Context(), connect.NewRequest(&pb.SetTimeoutRequest{SandboxId: id, Timeout: tc.timeout}))
			wantCode(t, err, connect.CodeInvalidArgument, "timeout:")
		})
	}
}

// With max_lifetime, an end is cut to the sandbox's last start (its
// create, or its last resume) plus that, as e2b's API bounds it; a sandbox
// that has run that long is refused (out_of_range). With only_extend an
// end is never moved earlier.
func TestSetTimeoutLifetime(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create().GetSandbox().GetId() // started at epoch, endAt = epoch + 5m
	set := func(timeout, maxLife time.Duration, onlyExtend bool) (time.Time, error) {
		t.Helper()
		req := &pb.SetTimeoutRequest{SandboxId: id, Timeout: durationpb.New(timeout), OnlyExtend: onlyExtend}
		if maxLife > 0 {
			req.MaxLifetime = durationpb.New(maxLife)
		}
		resp, err := h.client.SetTimeout(t.Context(), connect.NewRequest(req))
		if err != nil {
			return time.Time{}, err
		}
		return resp.Msg.GetSandbox().GetEndAt().AsTime(), nil
	}
	h.clock.Step(time.Minute)
	if end, err := set(time.Hour, 10*time.Minute, false); err != nil || !end.Equal(epoch.Add(10*time.Minute)) {
		t.Fatalf("an hour, at most 10 minutes from the start a minute ago: %v, %v; want the start + 10m", end, err)
	}
	if end, err := set(2*time.Minute, 10*time.Minute, true); err != nil || !end.Equal(epoch.Add(10*time.Minute)) {
		t.Fatalf("only extend to a minute from now: %v, %v; want the end kept", end, err)
	}
	if end, err := set(2*time.Minute, 10*time.Minute, false); err != nil || !end.Equal(epoch.Add(3*time.Minute)) {
		t.Fatalf("2 minutes: %v, %v; want now + 2m", end, err)
	}
	_, err := set(time.Minute, 30*time.Second, false)
	wantCode(t, err, connect.CodeOutOfRange, "longest lifetime")
	// The caller's bound may be longer than this host's longest timeout.
	if end, err := set(2*time.Minute, 48*time.Hour, false); err != nil || !end.Equal(epoch.Add(3*time.Minute)) {
		t.Fatalf("2 minutes, at most 48 hours: %v, %v; want now + 2m", end, err)
	}
	if at, ok := h.svc.deadlines.Deadline(id); !ok || !at.Equal(epoch.Add(3*time.Minute)) {
		t.Fatalf("deadline after the refusal = %v %v; want it unchanged", at, ok)
	}

	// A record from before sandboxd kept the last start has no bound
	// until its next resume: its last resume is not known.
	if _, err := h.reg.Update(id, func(r *store.Record) error { r.RunStart = time.Time{}; return nil }); err != nil {
		t.Fatal(err)
	}
	if end, err := set(time.Hour, 30*time.Second, false); err != nil || !end.Equal(epoch.Add(time.Hour+time.Minute)) {
		t.Fatalf("a record without its last start: %v, %v; want now + 1h", end, err)
	}

	// A resume starts the count afresh.
	if _, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Hour)
	resumed := h.clock.Now()
	if _, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: id, Timeout: durationpb.New(time.Minute)})); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Minute / 2)
	if end, err := set(time.Hour, 10*time.Minute, false); err != nil || !end.Equal(resumed.Add(10*time.Minute)) {
		t.Fatalf("after a resume: %v, %v; want the resume + 10m (%v)", end, err, resumed.Add(10*time.Minute))
	}
	if at, ok := h.svc.deadlines.Deadline(id); !ok || !at.Equal(resumed.Add(10*time.Minute)) {
		t.Fatalf("deadline = %v %v; want the resume + 10m", at, ok)
	}
}

func TestDeadline(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	kill := h.create().GetSandbox().GetId()
	pause := h.create(func(m *pb.CreateRequest) { m.AutoPause = true }).GetSandbox().GetId()
	later := h.create(func(m *pb.CreateRequest) { m.Timeout = durationpb.New(time.Hour) }).GetSandbox().GetId()

	h.clock.Step(5 * time.Minute)
	eventually(t, "kill at the deadline", func() bool { return h.gone(kill) })
	eventually(t, "pause at the deadline", func() bool {
		rec, err := h.reg.Get(pause)
		return err == nil && rec.State == registry.StatePaused
	})
	if h.rt.Running(kill) || h.net.Has(kill) {
		t.Fatal("the killed sandbox still holds runtime or network")
	}
	if _, err := h.get(later); err != nil {
		t.Fatalf("a later deadline fired: %v", err)
	}
	// An auto-paused sandbox was paused at its deadline: a resume needs a
	// timeout.
	_, err := h.client.Resume(t.Context(), connect.NewRequest(&pb.ResumeRequest{SandboxId: pause}))
	wantCode(t, err, connect.CodeInvalidArgument, "timeout:")
}

// TestKillRacesPause runs kills and pauses of the same sandboxes at once:
// each sandbox ends killed, nothing is left, and no call fails but with
// not_found or failed_precondition.
func TestKillRacesPause(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	var ids []string
	for range 5 {
		ids = append(ids, h.create().GetSandbox().GetId())
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			_, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: id}))
			if c := connect.CodeOf(err); err != nil && c != connect.CodeNotFound {
				t.Errorf("Pause: %v", err)
			}
		})
		wg.Go(func() {
			if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
				t.Errorf("Kill: %v", err)
			}
		})
	}
	wg.Wait()
	h.assertNothingHeld()
}
