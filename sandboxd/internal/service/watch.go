package service

import (
	"context"
	"sync"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Watch streams the host's sandboxes: a snapshot, then every change, and a
// HostChanged whenever sandboxd changes what Info says of the host (a
// snapshot taken, pulled or deleted, a volume made or deleted, the disk's
// pressure come or gone). A
// watcher that falls too far behind is dropped by the registry; the stream
// then starts over with a fresh snapshot, as an informer relists. It ends
// when the client goes away or the service stops its watches
// (StopWatches).
func (s *Service) Watch(ctx context.Context, _ *connect.Request[pb.WatchRequest], stream *connect.ServerStream[pb.WatchResponse]) error {
	return s.watch(ctx, stream.Send)
}

// watch is Watch over any sender.
func (s *Service) watch(ctx context.Context, send func(*pb.WatchResponse) error) error {
	for {
		// Wait on hostChanged before the snapshot is taken: a change made
		// while the snapshot is sent is then announced, and a client that
		// asks Info once it has the snapshot misses none.
		hostChanged := s.hostChanged.wait()
		snapshot, events, stop := s.watchSource()
		err := s.watchOnce(ctx, send, hostChanged, snapshot, events)
		stop()
		if err != nil || ctx.Err() != nil || s.isStopping() {
			return err
		}
		s.metrics.watchResyncs.Inc()
	}
}

// watchOnce sends the snapshot and then the events until the channel
// closes (the watcher was dropped), the client goes away or StopWatches
// is called. hostChanged is the host's change channel as of before the
// snapshot.
func (s *Service) watchOnce(ctx context.Context, send func(*pb.WatchResponse) error, hostChanged <-chan struct{}, snapshot []*store.Record, events <-chan registry.Event) error {
	snap := &pb.WatchResponse_Snapshot{Sandboxes: make([]*pb.Sandbox, 0, len(snapshot))}
	for _, rec := range snapshot {
		snap.Sandboxes = append(snap.Sandboxes, s.toSandbox(rec))
	}
	if err := send(&pb.WatchResponse{Event: &pb.WatchResponse_Snapshot_{Snapshot: snap}}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return nil
		case <-hostChanged:
			hostChanged = s.hostChanged.wait()
			if err := send(&pb.WatchResponse{Event: &pb.WatchResponse_HostChanged_{HostChanged: &pb.WatchResponse_HostChanged{}}}); err != nil {
				return err
			}
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			typ := pb.WatchResponse_CHANGE_TYPE_UPSERTED
			if ev.Type == registry.Deleted {
				typ = pb.WatchResponse_CHANGE_TYPE_DELETED
			}
			change := &pb.WatchResponse_Change{Type: typ, Sandbox: s.toSandbox(ev.Record), Ended: ev.Ended}
			if err := send(&pb.WatchResponse{Event: &pb.WatchResponse_Change_{Change: change}}); err != nil {
				return err
			}
		}
	}
}

// broadcast wakes every waiter at once, each time it is notified.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next notify.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

func (s *Service) isStopping() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}
