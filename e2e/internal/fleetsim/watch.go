package fleetsim

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// watchBuffer is how many changes a Watch stream may fall behind before it
// is ended (its follower then reconnects and starts from a snapshot).
const watchBuffer = 8192

// watcher is one Watch stream's queue of changes.
type watcher struct {
	ch chan *pb.WatchResponse
	// behind is closed when the stream fell watchBuffer changes behind;
	// ended when the host ends every stream (EndWatches).
	behind, ended chan struct{}
}

// emitLocked queues a change for every stream; s.mu is held.
func (s *Sandboxd) emitLocked(m *pb.WatchResponse) {
	for w := range s.watchers {
		select {
		case w.ch <- m:
		default:
			close(w.behind)
			delete(s.watchers, w)
		}
	}
}

// Watch streams the host's sandboxes: a snapshot, then every change, until
// the caller goes, the stream falls too far behind, or EndWatches.
func (s *Sandboxd) Watch(ctx context.Context, _ *connect.Request[pb.WatchRequest], stream *connect.ServerStream[pb.WatchResponse]) error {
	w := &watcher{ch: make(chan *pb.WatchResponse, watchBuffer), behind: make(chan struct{}), ended: make(chan struct{})}
	s.mu.Lock()
	snap := &pb.WatchResponse_Snapshot{Sandboxes: make([]*pb.Sandbox, 0, len(s.ids))}
	for _, id := range s.ids {
		snap.Sandboxes = append(snap.Sandboxes, s.sandboxes[id].sb)
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
	}()
	if err := stream.Send(&pb.WatchResponse{Event: &pb.WatchResponse_Snapshot_{Snapshot: snap}}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.behind:
			return connect.NewError(connect.CodeResourceExhausted, errors.New("the watch fell too far behind: watch again"))
		case <-w.ended:
			return connect.NewError(connect.CodeUnavailable, errors.New("the host is going away"))
		case m := <-w.ch:
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// EndWatches ends every Watch stream at once.
func (s *Sandboxd) EndWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.watchers {
		close(w.ended)
		delete(s.watchers, w)
	}
}
