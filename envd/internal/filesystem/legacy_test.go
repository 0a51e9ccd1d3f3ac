package filesystem

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/skiff-dev/skiff/envd/proto/filesystem"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
)

// userAgent sends every request with its User-Agent (connect-go's client
// would add its own before a stream's).
type userAgent string

func (ua userAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", string(ua))
	return http.DefaultTransport.RoundTrip(r)
}

// wantTrimmed fails unless e holds its name, type and path and nothing
// else (trimmed) or more than that (not).
func wantTrimmed(t *testing.T, what string, e *filesystem.EntryInfo, trimmed bool) {
	t.Helper()
	bare := &filesystem.EntryInfo{Name: e.GetName(), Type: e.GetType(), Path: e.GetPath()}
	if e.GetName() == "" || e.GetPath() == "" || e.GetType() == filesystem.FileType_FILE_TYPE_UNSPECIFIED || proto.Equal(e, bare) != trimmed {
		t.Errorf("%s: entry %v; want it trimmed to its name, type and path: %v", what, e, trimmed)
	}
}

// An SDK that names itself connect-python (the Python SDK before 1.7.1) is
// answered as e2b's envd answers it: entries with their name, type and
// path only, events without their entry, and X-E2B-Legacy-SDK: true.
// Any other client gets whole answers.
func TestLegacyPythonSDK(t *testing.T) {
	_, _, url := newTestServerURL(t, connect.WithInterceptors(Legacy()))
	ctx := context.Background()
	for _, ua := range []string{"connect-python", "e2b-python-sdk/1.7.1"} {
		trimmed := ua == "connect-python"
		t.Run(ua, func(t *testing.T) {
			client := filesystemconnect.NewFilesystemClient(&http.Client{Transport: userAgent(ua)}, url, connect.WithProtoJSON())
			dir := t.TempDir()
			file := filepath.Join(dir, "f.txt")
			if err := os.WriteFile(file, []byte("hello"), 0o644); err != nil {
				t.Fatal(err)
			}
			header := func(h interface{ Get(string) string }) {
				t.Helper()
				if got := h.Get("X-E2B-Legacy-SDK") == "true"; got != trimmed {
					t.Errorf("X-E2B-Legacy-SDK: %q", h.Get("X-E2B-Legacy-SDK"))
				}
			}
			st, err := client.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: file}))
			if err != nil {
				t.Fatal(err)
			}
			header(st.Header())
			wantTrimmed(t, "Stat", st.Msg.GetEntry(), trimmed)
			ls, err := client.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: dir}))
			if err != nil || len(ls.Msg.GetEntries()) != 1 {
				t.Fatalf("ListDir: %v, %v", ls, err)
			}
			wantTrimmed(t, "ListDir", ls.Msg.GetEntries()[0], trimmed)
			mk, err := client.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(dir, "d")}))
			if err != nil {
				t.Fatal(err)
			}
			wantTrimmed(t, "MakeDir", mk.Msg.GetEntry(), trimmed)
			mv, err := client.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: file, Destination: filepath.Join(dir, "g.txt")}))
			if err != nil {
				t.Fatal(err)
			}
			wantTrimmed(t, "Move", mv.Msg.GetEntry(), trimmed)
			// An error is e2b's whatever the client.
			if _, err := client.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: file})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("Stat of a moved file: %v", err)
			}

			// Events, streamed and polled, asked with their entries.
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			stream, err := client.WatchDir(wctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, IncludeEntry: true}))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			if !stream.Receive() || stream.Msg().GetStart() == nil {
				t.Fatalf("WatchDir's start: %v", stream.Err())
			}
			header(stream.ResponseHeader())
			w, err := client.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, IncludeEntry: true}))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "h.txt"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			for stream.Receive() && stream.Msg().GetFilesystem() == nil {
			}
			if ev := stream.Msg().GetFilesystem(); ev.GetName() != "h.txt" || (ev.Entry == nil) != trimmed {
				t.Errorf("WatchDir's event %v (%v); want h.txt, without its entry: %v", ev, stream.Err(), trimmed)
			}
			var events []*filesystem.FilesystemEvent
			for deadline := time.Now().Add(10 * time.Second); len(events) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				r, err := client.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()}))
				if err != nil {
					t.Fatal(err)
				}
				events = r.Msg.GetEvents()
			}
			if len(events) == 0 || events[0].GetName() != "h.txt" || (events[0].Entry == nil) != trimmed {
				t.Errorf("GetWatcherEvents: %v; want h.txt, without its entry: %v", events, trimmed)
			}
		})
	}
}
