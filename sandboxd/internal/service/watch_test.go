package service

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

func TestWatch(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	first := h.create().GetSandbox().GetId()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := h.client.Watch(ctx, connect.NewRequest(&pb.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	next := func() *pb.WatchResponse {
		t.Helper()
		if !stream.Receive() {
			t.Fatalf("stream ended: %v", stream.Err())
		}
		return stream.Msg()
	}
	snap := next().GetSnapshot()
	if snap == nil || len(snap.GetSandboxes()) != 1 || snap.GetSandboxes()[0].GetId() != first {
		t.Fatalf("first message = %v, want a snapshot of %s", snap, first)
	}

	second := h.create().GetSandbox().GetId()
	if ch := next().GetChange(); ch.GetType() != pb.WatchResponse_CHANGE_TYPE_UPSERTED || ch.GetSandbox().GetId() != second ||
		ch.GetSandbox().GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING {
		t.Fatalf("change = %v, want %s upserted", ch, second)
	}
	if _, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: first})); err != nil {
		t.Fatal(err)
	}
	if ch := next().GetChange(); ch.GetSandbox().GetId() != first || ch.GetSandbox().GetState() != pb.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("change = %v, want %s paused", ch, first)
	}
	if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: second})); err != nil {
		t.Fatal(err)
	}
	if ch := next().GetChange(); ch.GetType() != pb.WatchResponse_CHANGE_TYPE_DELETED || ch.GetSandbox().GetId() != second {
		t.Fatalf("change = %v, want %s deleted", ch, second)
	}
}

// TestWatchResync: when the registry drops a lagging watcher (its channel
// closes), the stream starts over with a fresh snapshot.
func TestWatchResync(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	calls := 0
	h.svc.watchSource = func() ([]*store.Record, <-chan registry.Event, func()) {
		calls++
		ch := make(chan registry.Event, 1)
		rec := &store.Record{ID: "aaaaaaaaaaaaaaaaaaaa", State: registry.StateRunning}
		if calls == 1 {
			ch <- registry.Event{Type: registry.Upserted, Record: rec}
			close(ch) // dropped for lagging
			return nil, ch, func() {}
		}
		return []*store.Record{rec}, ch, func() {}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []*pb.WatchResponse
	err := h.svc.watch(ctx, func(m *pb.WatchResponse) error {
		got = append(got, m)
		if len(got) == 3 {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].GetSnapshot() == nil || got[1].GetChange() == nil ||
		got[2].GetSnapshot() == nil || len(got[2].GetSnapshot().GetSandboxes()) != 1 {
		t.Fatalf("messages = %v, want snapshot, change, fresh snapshot", got)
	}
}
