package filesystem

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/envd/proto/filesystem"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
)

type watchStream = *connect.ServerStreamForClient[filesystem.WatchDirResponse]

// openWatch starts a WatchDir stream and checks its first message is start.
func openWatch(t *testing.T, ctx context.Context, client filesystemconnect.FilesystemClient, req *connect.Request[filesystem.WatchDirRequest]) watchStream {
	t.Helper()
	stream, err := client.WatchDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stream.Close() })
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	if stream.Msg().GetStart() == nil {
		t.Fatalf("first message = %v, want start", stream.Msg())
	}
	return stream
}

// waitEvent receives until an event with name and type arrives, failing on
// stream end (the stream's context bounds the wait). It returns the event
// and the events seen before it.
func waitEvent(t *testing.T, stream watchStream, name string, typ filesystem.EventType) (*filesystem.FilesystemEvent, []*filesystem.FilesystemEvent) {
	t.Helper()
	var seen []*filesystem.FilesystemEvent
	for stream.Receive() {
		ev := stream.Msg().GetFilesystem()
		if ev == nil {
			continue // keepalive
		}
		if ev.GetName() == name && ev.GetType() == typ {
			return ev, seen
		}
		seen = append(seen, ev)
	}
	t.Fatalf("stream ended before %s %s: %v (saw %v)", typ, name, stream.Err(), seen)
	return nil, nil
}

func TestWatchDir(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "old"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := openWatch(t, ctx, client, as("", &filesystem.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}))

	// A file at the top: create and write, with entries.
	if err := os.WriteFile(filepath.Join(dir, "w.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	ev, _ := waitEvent(t, stream, "w.txt", filesystem.EventType_EVENT_TYPE_WRITE)
	if e := ev.GetEntry(); e == nil || e.GetPath() != filepath.Join(dir, "w.txt") || e.GetType() != filesystem.FileType_FILE_TYPE_FILE {
		t.Errorf("write event entry = %v", e)
	}

	// A directory that existed before the watch started.
	if err := os.WriteFile(filepath.Join(dir, "old", "o.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "old/o.txt", filesystem.EventType_EVENT_TYPE_CREATE)

	// A directory created after the watch started, then a file in it.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	ev, _ = waitEvent(t, stream, "sub", filesystem.EventType_EVENT_TYPE_CREATE)
	if ev.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("sub entry = %v", ev.GetEntry())
	}
	// The watch on sub is added when its CREATE is handled, which happened
	// before that event was sent; a write now must be seen.
	if err := os.WriteFile(filepath.Join(sub, "n.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "sub/n.txt", filesystem.EventType_EVENT_TYPE_WRITE)

	// Nested directories created at once are reported and watched.
	if err := os.MkdirAll(filepath.Join(dir, "p", "q", "r"), 0o755); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "p/q/r", filesystem.EventType_EVENT_TYPE_CREATE)
	if err := os.WriteFile(filepath.Join(dir, "p", "q", "r", "deep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "p/q/r/deep", filesystem.EventType_EVENT_TYPE_WRITE)

	// Chmod, rename and remove; a removed path has no entry.
	if err := os.Chmod(filepath.Join(dir, "w.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "w.txt", filesystem.EventType_EVENT_TYPE_CHMOD)
	if err := os.Rename(filepath.Join(dir, "w.txt"), filepath.Join(dir, "r.txt")); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "w.txt", filesystem.EventType_EVENT_TYPE_RENAME)
	waitEvent(t, stream, "r.txt", filesystem.EventType_EVENT_TYPE_CREATE)
	if err := os.Remove(filepath.Join(dir, "r.txt")); err != nil {
		t.Fatal(err)
	}
	ev, _ = waitEvent(t, stream, "r.txt", filesystem.EventType_EVENT_TYPE_REMOVE)
	if ev.Entry != nil {
		t.Errorf("remove event has an entry: %v", ev.GetEntry())
	}
	// A rename has none either, even when something new is at its path
	// (as e2b's: only creates, writes and chmods carry one).
	if err := os.WriteFile(filepath.Join(dir, "a"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "b"), filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if ev, _ = waitEvent(t, stream, "b", filesystem.EventType_EVENT_TYPE_RENAME); ev.Entry != nil {
		t.Errorf("rename event has an entry: %v", ev.GetEntry())
	}

	// The watched directory removed: as e2b's envd, an event named ".".
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, ".", filesystem.EventType_EVENT_TYPE_REMOVE)
}

func TestWatchDirNonRecursive(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := openWatch(t, ctx, client, as("", &filesystem.WatchDirRequest{Path: dir}))
	if err := os.WriteFile(filepath.Join(dir, "sub", "hidden"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "top"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ev, seen := waitEvent(t, stream, "top", filesystem.EventType_EVENT_TYPE_WRITE)
	if ev.Entry != nil {
		t.Errorf("entry without include_entry: %v", ev.GetEntry())
	}
	for _, s := range seen {
		if strings.HasPrefix(s.GetName(), "sub/") {
			t.Errorf("non-recursive watch reported %v", s)
		}
	}
}

func TestWatchDirErrors(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		user string
		path string
		code connect.Code
	}{
		{"missing", "", filepath.Join(dir, "missing"), connect.CodeNotFound},
		{"file", "", file, connect.CodeInvalidArgument},
		{"unknown user", "no-such-user-xyz", dir, connect.CodeUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := client.WatchDir(ctx, as(tt.user, &filesystem.WatchDirRequest{Path: tt.path}))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			if stream.Receive() {
				t.Fatalf("got %v, want no message", stream.Msg())
			}
			wantCode(t, stream.Err(), tt.code)
		})
	}
}

func TestWatchDirKeepalive(t *testing.T) {
	client, _ := newTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := as("", &filesystem.WatchDirRequest{Path: t.TempDir()})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	stream := openWatch(t, ctx, client, req)
	start := time.Now()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	if stream.Msg().GetKeepalive() == nil {
		t.Fatalf("got %v, want keepalive", stream.Msg())
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("keepalive after %v, want about 1s", d)
	}
}

func TestWatchDirDeadline(t *testing.T) {
	client, _ := newTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stream := openWatch(t, ctx, client, as("", &filesystem.WatchDirRequest{Path: t.TempDir()}))
	for stream.Receive() {
	}
	wantCode(t, stream.Err(), connect.CodeDeadlineExceeded)
}

// envelope frames one Connect streaming message.
func envelope(flags byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// TestWatchDirDeadlineWire checks, on the wire as the SDK sees it, that the
// server itself ends the stream with deadline_exceeded when
// Connect-Timeout-Ms passes.
func TestWatchDirDeadlineWire(t *testing.T) {
	svc := New(state.New())
	path, h := filesystemconnect.NewFilesystemHandler(svc)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer svc.Close()

	body := envelope(0, []byte(fmt.Sprintf(`{"path":%q,"recursive":true}`, t.TempDir())))
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/filesystem.Filesystem/WatchDir", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", "300")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var msgs []string
	var end []byte
	for end == nil {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			t.Fatalf("read envelope: %v (messages so far %v)", err, msgs)
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, payload); err != nil {
			t.Fatal(err)
		}
		if hdr[0]&2 != 0 {
			end = payload
		} else {
			msgs = append(msgs, string(payload))
		}
	}
	if len(msgs) != 1 || msgs[0] != `{"start":{}}` {
		t.Errorf("messages = %q, want just start", msgs)
	}
	var eos struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(end, &eos); err != nil {
		t.Fatalf("end of stream %q: %v", end, err)
	}
	if eos.Error.Code != "deadline_exceeded" || eos.Error.Message != "context deadline exceeded" {
		t.Errorf("end of stream = %s", end)
	}
}

// watcherCount is how many watchers svc tracks.
func watcherCount(svc *Service) int {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return len(svc.watchers)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatchDirCancelStopsWatcher(t *testing.T) {
	client, svc := newTestServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	openWatch(t, ctx, client, as("", &filesystem.WatchDirRequest{Path: t.TempDir(), Recursive: true}))
	if n := watcherCount(svc); n != 1 {
		t.Fatalf("%d watchers, want 1", n)
	}
	cancel()
	eventually(t, "the watcher to stop", func() bool { return watcherCount(svc) == 0 })
}

func TestCloseEndsStreams(t *testing.T) {
	client, svc := newTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream := openWatch(t, ctx, client, as("", &filesystem.WatchDirRequest{Path: t.TempDir()}))
	svc.Close()
	for stream.Receive() {
	}
	wantCode(t, stream.Err(), connect.CodeUnavailable)
	_, err := client.CreateWatcher(ctx, as("", &filesystem.CreateWatcherRequest{Path: t.TempDir()}))
	wantCode(t, err, connect.CodeUnavailable)
}

func TestPollingWatcher(t *testing.T) {
	client, svc := newTestServer(t)
	dir := t.TempDir()
	ctx := context.Background()

	resp, err := client.CreateWatcher(ctx, as("", &filesystem.CreateWatcherRequest{Path: dir, Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetWatcherId()
	if len(id) != 20 || !strings.HasPrefix(id, "wt") || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		t.Errorf("watcher id %q, want wt + 18 of [a-z0-9]", id)
	}

	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	var got []*filesystem.FilesystemEvent
	has := func(name string, typ filesystem.EventType) bool {
		for _, ev := range got {
			if ev.GetName() == name && ev.GetType() == typ {
				return true
			}
		}
		return false
	}
	poll := func() bool {
		r, err := client.GetWatcherEvents(ctx, as("", &filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Msg.GetEvents()...)
		return false
	}
	eventually(t, "CREATE d", func() bool { poll(); return has("d", filesystem.EventType_EVENT_TYPE_CREATE) })
	if err := os.WriteFile(filepath.Join(dir, "d", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "WRITE d/f", func() bool { poll(); return has("d/f", filesystem.EventType_EVENT_TYPE_WRITE) })
	for _, ev := range got {
		if ev.GetName() == "d/f" && ev.GetEntry().GetPath() != filepath.Join(dir, "d", "f") {
			t.Errorf("event entry = %v", ev.GetEntry())
		}
	}

	// Drained: nothing left.
	r, err := client.GetWatcherEvents(ctx, as("", &filesystem.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil || len(r.Msg.GetEvents()) != 0 {
		t.Errorf("second drain: %v, %v", r.Msg.GetEvents(), err)
	}

	if _, err := client.RemoveWatcher(ctx, as("", &filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if n := watcherCount(svc); n != 0 {
		t.Errorf("%d watchers after RemoveWatcher", n)
	}
	_, err = client.GetWatcherEvents(ctx, as("", &filesystem.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = client.RemoveWatcher(ctx, as("", &filesystem.RemoveWatcherRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = client.GetWatcherEvents(ctx, as("", &filesystem.GetWatcherEventsRequest{WatcherId: "wtunknown"}))
	wantCode(t, err, connect.CodeNotFound)

	_, err = client.CreateWatcher(ctx, as("", &filesystem.CreateWatcherRequest{Path: filepath.Join(dir, "missing")}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = client.CreateWatcher(ctx, as("", &filesystem.CreateWatcherRequest{Path: filepath.Join(dir, "d", "f")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.CreateWatcher(ctx, as("no-such-user-xyz", &filesystem.CreateWatcherRequest{Path: dir}))
	wantCode(t, err, connect.CodeUnauthenticated)

	// Close stops polled watchers too.
	if _, err := client.CreateWatcher(ctx, as("", &filesystem.CreateWatcherRequest{Path: dir})); err != nil {
		t.Fatal(err)
	}
	svc.Close()
	if n := watcherCount(svc); n != 0 {
		t.Errorf("%d watchers after Close", n)
	}
}

func TestPollQueueBound(t *testing.T) {
	q := &pollQueue{}
	for i := range maxQueuedEvents + 5 {
		q.push(&filesystem.FilesystemEvent{Name: fmt.Sprint(i)})
	}
	evs := q.drain()
	if len(evs) != maxQueuedEvents || evs[0].GetName() != "5" || q.dropped != 5 {
		t.Errorf("len %d, first %q, dropped %d", len(evs), evs[0].GetName(), q.dropped)
	}
	if len(q.drain()) != 0 {
		t.Error("queue not drained")
	}
}
