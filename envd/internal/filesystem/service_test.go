package filesystem

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/envd/internal/ensure/ensuretest"
	"github.com/skiff-dev/skiff/envd/internal/identity"
	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/envd/proto/filesystem"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
	"github.com/skiff-dev/skiff/wire"
)

// newTestServer serves a Service over HTTP and returns a JSON client like
// the SDKs'.
func newTestServer(t *testing.T, opts ...connect.HandlerOption) (filesystemconnect.FilesystemClient, *Service) {
	t.Helper()
	client, svc, _ := newTestServerURL(t, opts...)
	return client, svc
}

// newTestServerURL is newTestServer that also returns the server's URL.
func newTestServerURL(t *testing.T, opts ...connect.HandlerOption) (filesystemconnect.FilesystemClient, *Service, string) {
	t.Helper()
	svc := New(state.New())
	path, h := filesystemconnect.NewFilesystemHandler(svc, opts...)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		svc.Close()
		srv.Close()
	})
	return filesystemconnect.NewFilesystemClient(http.DefaultClient, srv.URL, connect.WithProtoJSON()), svc, srv.URL
}

// as sets the Basic-auth user of req, like the SDK does.
func as[T any](user string, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return req
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want %v", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("code = %v (%v), want %v", got, err, code)
	}
}

func TestStat(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(file, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	tests := []struct {
		name string
		user string
		path string
		code connect.Code // 0: success
		msg  string       // substring of the error message
	}{
		{"file", "", file, 0, ""},
		{"as root", "root", file, 0, ""},
		{"missing", "", filepath.Join(dir, "nope"), connect.CodeNotFound, "file not found: lstat " + filepath.Join(dir, "nope")},
		{"unknown user", "no-such-user-xyz", file, connect.CodeUnauthenticated, "invalid username: 'no-such-user-xyz'"},
		{"nul in path", "", "a\x00b", connect.CodeInvalidArgument, "NUL"},
		// Another user's home, refused as e2b's envd refuses it.
		{"another user's home", "", "~nobody", connect.CodeInvalidArgument, "invalid path '~nobody': cannot expand user-specific home dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.Stat(ctx, as(tt.user, &filesystem.StatRequest{Path: tt.path}))
			if tt.code != 0 {
				wantCode(t, err, tt.code)
				var ce *connect.Error
				if errors.As(err, &ce) && !strings.Contains(ce.Message(), tt.msg) {
					t.Errorf("message = %q, want it to contain %q", ce.Message(), tt.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e := resp.Msg.GetEntry()
			if e.GetName() != "f.txt" || e.GetPath() != file || e.GetSize() != 5 || e.GetType() != filesystem.FileType_FILE_TYPE_FILE || e.GetOwner() != "root" {
				t.Errorf("entry = %v", e)
			}
		})
	}

	t.Run("relative path resolves against home", func(t *testing.T) {
		// root's home is /root; "~" must be it.
		resp, err := client.Stat(ctx, as("root", &filesystem.StatRequest{Path: "~"}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.GetEntry().GetPath() != "/root" {
			t.Errorf("path = %q, want /root", resp.Msg.GetEntry().GetPath())
		}
	})
}

// A metadata value that is not UTF-8 (set inside the sandbox with setfattr)
// is left out; Stat and ListDir still answer, with the rest of the entry.
func TestMetadataNotUTF8(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(file, "user.e2b.good", []byte("ok"), 0); err != nil {
		t.Skipf("no user xattrs on %s: %v", dir, err)
	}
	if err := unix.Lsetxattr(file, "user.e2b.bad", []byte("\xff"), 0); err != nil {
		t.Fatal(err)
	}
	stat, err := client.Stat(t.Context(), as("", &filesystem.StatRequest{Path: file}))
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	list, err := client.ListDir(t.Context(), as("", &filesystem.ListDirRequest{Path: dir}))
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	if len(list.Msg.GetEntries()) != 1 {
		t.Fatalf("ListDir = %v, want f.txt", list.Msg.GetEntries())
	}
	for _, e := range []*filesystem.EntryInfo{stat.Msg.GetEntry(), list.Msg.GetEntries()[0]} {
		if md := e.GetMetadata(); len(md) != 1 || md["good"] != "ok" {
			t.Errorf("metadata = %q, want good=ok alone", md)
		}
	}
}

func TestMakeDir(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	ctx := context.Background()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	deep := filepath.Join(dir, "a", "b", "c")
	resp, err := client.MakeDir(ctx, as("", &filesystem.MakeDirRequest{Path: deep}))
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Msg.GetEntry(); e.GetPath() != deep || e.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || e.GetName() != "c" {
		t.Errorf("entry = %v", e)
	}

	_, err = client.MakeDir(ctx, as("", &filesystem.MakeDirRequest{Path: deep}))
	wantCode(t, err, connect.CodeAlreadyExists)

	_, err = client.MakeDir(ctx, as("", &filesystem.MakeDirRequest{Path: file}))
	wantCode(t, err, connect.CodeInvalidArgument)

	_, err = client.MakeDir(ctx, as("", &filesystem.MakeDirRequest{Path: filepath.Join(file, "sub")}))
	wantCode(t, err, connect.CodeInvalidArgument)

	_, err = client.MakeDir(ctx, as("", &filesystem.MakeDirRequest{Path: ""}))
	wantCode(t, err, connect.CodeInvalidArgument)

	_, err = client.MakeDir(ctx, as("no-such-user-xyz", &filesystem.MakeDirRequest{Path: deep}))
	wantCode(t, err, connect.CodeUnauthenticated)

	t.Run("created dirs are owned by the user", func(t *testing.T) {
		tr := ensuretest.New(t)
		u := tr.User
		p := filepath.Join(tr.Home, "owned", "x")
		resp, err := client.MakeDir(ctx, as(u.Name, &filesystem.MakeDirRequest{Path: p}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.GetEntry().GetOwner() != u.Name {
			t.Errorf("owner = %q, want %s", resp.Msg.GetEntry().GetOwner(), u.Name)
		}
		ensuretest.CheckOwner(t, filepath.Join(tr.Home, "owned"), u.UID, u.GID)
		ensuretest.CheckOwner(t, p, u.UID, u.GID)
		// The pre-existing parent keeps its owner.
		ensuretest.CheckOwner(t, tr.Home, u.UID, u.GID)
	})
}

func TestMove(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	ctx := context.Background()
	src := filepath.Join(dir, "src.txt")
	if err := os.WriteFile(src, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "new", "parent", "dst.txt")
	resp, err := client.Move(ctx, as("", &filesystem.MoveRequest{Source: src, Destination: dst}))
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Msg.GetEntry(); e.GetPath() != dst || e.GetName() != "dst.txt" || e.GetSize() != 4 {
		t.Errorf("entry = %v", e)
	}
	if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("source still there: %v", err)
	}

	_, err = client.Move(ctx, as("", &filesystem.MoveRequest{Source: src, Destination: dst}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = client.Move(ctx, as("", &filesystem.MoveRequest{Source: dst, Destination: ""}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.Move(ctx, as("", &filesystem.MoveRequest{Source: "", Destination: dst}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.Move(ctx, as("no-such-user-xyz", &filesystem.MoveRequest{Source: dst, Destination: src}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestListDir(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	ctx := context.Background()
	for _, d := range []string{"a/b/c", "e"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"top.txt", "a/one.txt", "a/b/two.txt", "a/b/c/three.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink to a directory must be listed but not followed.
	if err := os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}

	rel := func(entries []*filesystem.EntryInfo) []string {
		var out []string
		for _, e := range entries {
			r, _ := filepath.Rel(dir, e.GetPath())
			out = append(out, r)
		}
		sort.Strings(out)
		return out
	}
	tests := []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"a", "e", "link", "top.txt"}},
		{1, []string{"a", "e", "link", "top.txt"}},
		{2, []string{"a", "a/b", "a/one.txt", "e", "link", "top.txt"}},
		{10, []string{"a", "a/b", "a/b/c", "a/b/c/three.txt", "a/b/two.txt", "a/one.txt", "e", "link", "top.txt"}},
	}
	for _, tt := range tests {
		resp, err := client.ListDir(ctx, as("", &filesystem.ListDirRequest{Path: dir, Depth: tt.depth}))
		if err != nil {
			t.Fatalf("depth %d: %v", tt.depth, err)
		}
		if got := rel(resp.Msg.GetEntries()); !slices.Equal(got, tt.want) {
			t.Errorf("depth %d: got %v, want %v", tt.depth, got, tt.want)
		}
		for _, e := range resp.Msg.GetEntries() {
			// A link is listed as what it leads to, as e2b's envd lists it.
			if e.GetName() == "link" && (e.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || e.GetSymlinkTarget() != filepath.Join(dir, "a")) {
				t.Errorf("link entry = %v", e)
			}
		}
	}

	_, err := client.ListDir(ctx, as("", &filesystem.ListDirRequest{Path: filepath.Join(dir, "top.txt")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.ListDir(ctx, as("", &filesystem.ListDirRequest{Path: filepath.Join(dir, "missing")}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = client.ListDir(ctx, as("no-such-user-xyz", &filesystem.ListDirRequest{Path: dir}))
	wantCode(t, err, connect.CodeUnauthenticated)
	resp, err := client.ListDir(ctx, as("", &filesystem.ListDirRequest{Path: filepath.Join(dir, "e")}))
	if err != nil || len(resp.Msg.GetEntries()) != 0 {
		t.Errorf("empty dir: %v, %v", resp, err)
	}
}

// ListDir of a link to a directory names the entries under the link's
// path, as e2b's envd does, not under its target's.
func TestListDirThroughLink(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "b")
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"x", "sub/y"} {
		if err := os.WriteFile(filepath.Join(target, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "a", "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	resp, err := client.ListDir(t.Context(), as("", &filesystem.ListDirRequest{Path: link, Depth: 2}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range resp.Msg.GetEntries() {
		got = append(got, e.GetPath())
		if e.GetName() != filepath.Base(e.GetPath()) {
			t.Errorf("entry %s is named %q", e.GetPath(), e.GetName())
		}
	}
	sort.Strings(got)
	want := []string{filepath.Join(link, "sub"), filepath.Join(link, "sub", "y"), filepath.Join(link, "x")}
	if !slices.Equal(got, want) {
		t.Fatalf("paths = %v, want %v", got, want)
	}
}

// An empty path means the default workdir (else the user's home) for the
// requests that only read: Stat, ListDir and the watches, as with e2b's
// envd. Those that change anything refuse it: e2b's would remove or
// overwrite the workdir or the home.
func TestEmptyPath(t *testing.T) {
	client, svc := newTestServer(t)
	ctx := t.Context()

	// Without a default workdir: the user's home (only stat'ed).
	root, err := identity.Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	stat, err := client.Stat(ctx, as("", &filesystem.StatRequest{}))
	if err != nil {
		t.Fatalf("Stat(\"\") without a workdir: %v", err)
	}
	if got := stat.Msg.GetEntry().GetPath(); got != root.Home {
		t.Fatalf("Stat(\"\") without a workdir = %s, want root's home %s", got, root.Home)
	}

	// With one (a temporary folder, so that nothing here touches a home).
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	svc.sb.Apply(wire.EnvdInit{DefaultWorkdir: dir})
	stat, err = client.Stat(ctx, as("", &filesystem.StatRequest{}))
	if err != nil || stat.Msg.GetEntry().GetPath() != dir {
		t.Fatalf("Stat(\"\") = %v, %v; want %s", stat, err, dir)
	}
	list, err := client.ListDir(ctx, as("", &filesystem.ListDirRequest{}))
	if err != nil || len(list.Msg.GetEntries()) != 1 || list.Msg.GetEntries()[0].GetPath() != file {
		t.Fatalf("ListDir(\"\") = %v, %v; want %s", list, err, file)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream := openWatch(t, wctx, client, as("", &filesystem.WatchDirRequest{}))
	if err := os.WriteFile(filepath.Join(dir, "new.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "new.txt", filesystem.EventType_EVENT_TYPE_CREATE)
	w, err := client.CreateWatcher(ctx, as("", &filesystem.CreateWatcherRequest{}))
	if err != nil {
		t.Fatalf("CreateWatcher(\"\"): %v", err)
	}
	if _, err := client.RemoveWatcher(ctx, as("", &filesystem.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}

	_, err = client.MakeDir(ctx, as("", &filesystem.MakeDirRequest{}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.Move(ctx, as("", &filesystem.MoveRequest{Destination: filepath.Join(dir, "moved")}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.Move(ctx, as("", &filesystem.MoveRequest{Source: file}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.Remove(ctx, as("", &filesystem.RemoveRequest{}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if got, err := os.ReadFile(file); err != nil || string(got) != "keep" {
		t.Fatalf("the workdir's file after the refused requests: %q, %v", got, err)
	}
}

func TestRemove(t *testing.T) {
	client, _ := newTestServer(t)
	dir := t.TempDir()
	ctx := context.Background()
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "x", "y"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "x", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Remove(ctx, as("", &filesystem.RemoveRequest{Path: tree})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree still there: %v", err)
	}
	if _, err := client.Remove(ctx, as("", &filesystem.RemoveRequest{Path: tree})); err != nil {
		t.Errorf("removing a missing path: %v", err)
	}
	_, err := client.Remove(ctx, as("", &filesystem.RemoveRequest{Path: ""}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = client.Remove(ctx, as("no-such-user-xyz", &filesystem.RemoveRequest{Path: tree}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestOSError(t *testing.T) {
	tests := []struct {
		err  error
		code connect.Code
	}{
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, connect.CodeNotFound},
		{&os.PathError{Op: "mkdir", Path: "/x", Err: syscall.EEXIST}, connect.CodeAlreadyExists},
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, connect.CodePermissionDenied},
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.EIO}, connect.CodeInternal},
		{connect.NewError(connect.CodeInvalidArgument, errors.New("x")), connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		if got := osError(tt.err).Code(); got != tt.code {
			t.Errorf("osError(%v) = %v, want %v", tt.err, got, tt.code)
		}
	}
}
