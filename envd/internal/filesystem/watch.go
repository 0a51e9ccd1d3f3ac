package filesystem

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	"github.com/skiff-dev/skiff/envd/internal/entry"
	"github.com/skiff-dev/skiff/envd/internal/keepalive"
	"github.com/skiff-dev/skiff/envd/proto/filesystem"
)

// maxQueuedEvents bounds a polled watcher's queue. A client that stops
// polling must not grow envd without bound, so beyond this many undrained
// events the oldest are dropped (the client sees a gap, as with an inotify
// overflow).
const maxQueuedEvents = 10_000

// watcher turns fsnotify events under root into FilesystemEvents. One
// goroutine (loop) owns the fsnotify watcher and calls emit; stop ends it.
type watcher struct {
	root         string
	recursive    bool
	includeEntry bool
	stopOnError  bool
	emit         func(ev *filesystem.FilesystemEvent, stop <-chan struct{})

	fw       *fsnotify.Watcher
	stopCh   chan struct{}
	done     chan struct{} // closed when loop has returned
	stopOnce sync.Once
	err      error // why loop ended on its own; read after done is closed
}

// checkWatchRoot validates the directory a watch is asked for.
func checkWatchRoot(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return osError(err)
	}
	if !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", p))
	}
	return nil
}

// startWatcher watches root (and, when recursive, every directory below it)
// and starts the goroutine delivering events to emit.
func startWatcher(root string, recursive, includeEntry, stopOnError bool, emit func(*filesystem.FilesystemEvent, <-chan struct{})) (*watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("create watcher: %w", err))
	}
	w := &watcher{
		root: root, recursive: recursive, includeEntry: includeEntry, stopOnError: stopOnError,
		emit: emit, fw: fw, stopCh: make(chan struct{}), done: make(chan struct{}),
	}
	if err := w.addRoot(); err != nil {
		_ = fw.Close()
		return nil, osError(err)
	}
	go w.loop()
	return w, nil
}

// addRoot checks the root and watches it (and, when recursive, the
// directories below it).
func (w *watcher) addRoot() error {
	if err := checkWatchRoot(w.root); err != nil {
		return err
	}
	if err := w.fw.Add(w.root); err != nil {
		return fmt.Errorf("watch %s: %w", w.root, err)
	}
	if w.recursive {
		_, err := w.addTree(w.root, false)
		return err
	}
	return nil
}

// addTree adds watches for the directories below dir (dir itself is already
// watched). Directories are not followed through symlinks. With announce, it
// also returns every entry found, for CREATE events: they appeared in a new
// directory before its watch existed, so inotify never reported them.
func (w *watcher) addTree(dir string, announce bool) ([]string, error) {
	var found []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && !announce {
				return err
			}
			return nil // vanished or unreadable: nothing to watch there
		}
		if p == dir {
			return nil
		}
		if announce {
			found = append(found, p)
		}
		if d.IsDir() {
			// Directories created later are watched on a best-effort basis;
			// at start every one must be watched.
			if err := w.fw.Add(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !announce {
				return fmt.Errorf("watch %s: %w", p, err)
			}
		}
		return nil
	})
	return found, err
}

// ops maps fsnotify operations to e2b event types, in the order emitted
// when one fsnotify event carries several.
var ops = []struct {
	op  fsnotify.Op
	typ filesystem.EventType
}{
	{fsnotify.Create, filesystem.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, filesystem.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, filesystem.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, filesystem.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, filesystem.EventType_EVENT_TYPE_CHMOD},
}

func (w *watcher) loop() {
	defer close(w.done)
	for {
		select {
		case <-w.stopCh:
			return
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			w.handle(ev)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			// A streamed watch ends on an error (e.g. an inotify queue
			// overflow, so events were lost) and WatchDir reports it as
			// internal; a polled watcher has no way to report it and
			// keeps going.
			if w.stopOnError && err != nil {
				w.err = err
				return
			}
		}
	}
}

func (w *watcher) handle(ev fsnotify.Event) {
	// The watched directory's own events (removed, moved away, its mode
	// changed) are sent as e2b's envd sends them, named ".".
	//
	// A new directory is watched before its CREATE is sent, so that a
	// client that writes into it on seeing that event is seen doing so;
	// what it already holds is announced after. Entries created between the
	// Add and the walk may be reported twice (by inotify and by the walk);
	// none are missed.
	var found []string
	if w.recursive && ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			if err := w.fw.Add(ev.Name); err == nil {
				found, _ = w.addTree(ev.Name, true)
			}
		}
	}
	for _, o := range ops {
		if ev.Has(o.op) {
			w.send(ev.Name, o.typ)
		}
	}
	for _, p := range found {
		w.send(p, filesystem.EventType_EVENT_TYPE_CREATE)
	}
}

// send emits one event for path.
func (w *watcher) send(path string, typ filesystem.EventType) {
	rel, err := filepath.Rel(w.root, path)
	if err != nil {
		rel = path
	}
	ev := &filesystem.FilesystemEvent{Name: rel, Type: typ}
	if w.includeEntry && carriesEntry(typ) {
		ev.Entry, _ = entry.Info(path)
	}
	w.emit(ev, w.stopCh)
}

// carriesEntry reports whether an event of typ has an entry with
// include_entry, as in e2b's envd: a create, a write or a chmod, whose path
// is there; not a remove or a rename (its path may hold something new).
func carriesEntry(typ filesystem.EventType) bool {
	switch typ {
	case filesystem.EventType_EVENT_TYPE_CREATE, filesystem.EventType_EVENT_TYPE_WRITE, filesystem.EventType_EVENT_TYPE_CHMOD:
		return true
	}
	return false
}

// stop ends the watcher and waits for its goroutine. It is idempotent.
func (w *watcher) stop() {
	w.stopOnce.Do(func() {
		close(w.stopCh)
		<-w.done
		_ = w.fw.Close()
	})
}

// newWatcherID returns a random id in e2b's style: "wt" and 18 characters of
// [a-z0-9], 20 in all.
func newWatcherID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte("wt" + "000000000000000000")
	buf := make([]byte, 1)
	for i := 2; i < len(b); {
		_, _ = rand.Read(buf) // crypto/rand.Read never fails
		if buf[0] >= 252 {    // 252 = 7*36: reject to stay unbiased
			continue
		}
		b[i] = alphabet[int(buf[0])%len(alphabet)]
		i++
	}
	return string(b)
}

// register records w under a fresh id so Close can stop it.
func (s *Service) register(w *watcher) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", connect.NewError(connect.CodeUnavailable, errors.New("envd filesystem service is closed"))
	}
	id := newWatcherID()
	for s.watchers[id] != nil {
		id = newWatcherID()
	}
	s.watchers[id] = w
	return id, nil
}

// unregister forgets the watcher id and returns it, or nil if unknown.
func (s *Service) unregister(id string) *watcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.watchers[id]
	delete(s.watchers, id)
	delete(s.polled, id)
	return w
}

// WatchDir streams the events under a directory: a start event once the
// watch is in place, then filesystem events, with keepalives when idle. It
// ends when the client cancels (nil) or the request deadline passes
// (deadline_exceeded). An empty path is the default workdir, else the user's
// home.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	p, err := s.resolveRead(req, req.Msg.GetPath())
	if err != nil {
		return err
	}
	// allow_network_mounts is accepted and ignored: a sandbox has no
	// network mounts to refuse.
	events := make(chan *filesystem.FilesystemEvent, 64)
	w, err := startWatcher(p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), true,
		func(ev *filesystem.FilesystemEvent, stop <-chan struct{}) {
			select {
			case events <- ev:
			case <-stop:
			}
		})
	if err != nil {
		return err
	}
	id, err := s.register(w)
	if err != nil {
		w.stop()
		return err
	}
	defer func() {
		s.unregister(id)
		w.stop()
	}()

	start := &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}
	if err := stream.Send(start); err != nil {
		return streamEnd(ctx, err)
	}
	interval := keepalive.Interval(req.Header())
	keepalive := time.NewTimer(interval)
	defer keepalive.Stop()
	for {
		var msg *filesystem.WatchDirResponse
		select {
		case <-ctx.Done():
			return streamEnd(ctx, ctx.Err())
		case <-w.done:
			if w.err != nil {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", p, w.err))
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("watcher stopped: envd is shutting down"))
		case ev := <-events:
			msg = &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}
		case <-keepalive.C:
			msg = &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}
		}
		if err := stream.Send(msg); err != nil {
			return streamEnd(ctx, err)
		}
		keepalive.Reset(interval)
	}
}

// streamEnd is what WatchDir returns when its context ends or a send fails:
// deadline_exceeded for a passed deadline, nil for a client that went away.
func streamEnd(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("send watch event: %w", err)
}

// pollQueue holds a polled watcher's undrained events.
type pollQueue struct {
	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	dropped int // events dropped because the queue was full
}

func (q *pollQueue) push(ev *filesystem.FilesystemEvent) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.events) >= maxQueuedEvents {
		// Drop the oldest to keep the queue bounded (see maxQueuedEvents).
		// Reslicing is amortized O(1): append reallocates (copying only
		// the live events) once the backing array's tail is used up.
		n := len(q.events) - maxQueuedEvents + 1
		clear(q.events[:n]) // let the dropped events be collected
		q.events = q.events[n:]
		q.dropped += n
	}
	q.events = append(q.events, ev)
}

func (q *pollQueue) drain() []*filesystem.FilesystemEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.events
	q.events = nil
	return out
}

// CreateWatcher starts a watcher whose events are queued until
// GetWatcherEvents drains them; it runs until RemoveWatcher or Close. An
// empty path is the default workdir, else the user's home, as for WatchDir.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	p, err := s.resolveRead(req, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	q := &pollQueue{}
	w, err := startWatcher(p, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), false,
		func(ev *filesystem.FilesystemEvent, _ <-chan struct{}) { q.push(ev) })
	if err != nil {
		return nil, err
	}
	id, err := s.register(w)
	if err != nil {
		w.stop()
		return nil, err
	}
	s.mu.Lock()
	s.polled[id] = q
	s.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// pollQueueOf returns the queue of a polled watcher, or not_found.
func (s *Service) pollQueueOf(id string) (*pollQueue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.polled[id]
	if q == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher with id %s not found", id))
	}
	return q, nil
}

// GetWatcherEvents returns and forgets the events queued for a watcher.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	if _, err := s.requestUser(req); err != nil {
		return nil, err
	}
	q, err := s.pollQueueOf(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: q.drain()}), nil
}

// RemoveWatcher stops a polled watcher and drops its queue.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	if _, err := s.requestUser(req); err != nil {
		return nil, err
	}
	id := req.Msg.GetWatcherId()
	if _, err := s.pollQueueOf(id); err != nil {
		return nil, err
	}
	if w := s.unregister(id); w != nil {
		w.stop()
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
