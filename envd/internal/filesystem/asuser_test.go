package filesystem

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/asuser/asusertest"
	"github.com/skiff-dev/skiff/envd/proto/filesystem"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
)

// TestAsUserIsCheckedAsTheUser: every RPC acting as an unprivileged user
// resolves and touches paths as that user would, whatever symlinks the user
// planted: what the user may not do is permission_denied and leaves root's
// files as they were; what the user may do works, and what it creates is
// the user's.
func TestAsUserIsCheckedAsTheUser(t *testing.T) {
	type call func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error
	for _, tc := range []struct {
		name  string
		call  call
		check func(t *testing.T, tr *asusertest.Tree) // nil: want permission_denied
	}{
		{name: "stat in a directory the user cannot enter", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.Stat(ctx, as(tr.User.Name, &filesystem.StatRequest{Path: tr.Hidden}))
			return err
		}},
		{name: "list a directory the user cannot enter", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.ListDir(ctx, as(tr.User.Name, &filesystem.ListDirRequest{Path: tr.Private}))
			return err
		}},
		{name: "make a directory through a link to root's directory", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.MakeDir(ctx, as(tr.User.Name, &filesystem.MakeDirRequest{Path: filepath.Join(tr.LinkDir, "a/b")}))
			return err
		}},
		{name: "make a directory in a directory the user cannot enter", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.MakeDir(ctx, as(tr.User.Name, &filesystem.MakeDirRequest{Path: filepath.Join(tr.Private, "a")}))
			return err
		}},
		{name: "remove root's file", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.Remove(ctx, as(tr.User.Name, &filesystem.RemoveRequest{Path: tr.Secret}))
			return err
		}},
		{name: "remove root's directory", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.Remove(ctx, as(tr.User.Name, &filesystem.RemoveRequest{Path: tr.RootDir}))
			return err
		}},
		{name: "remove a file in a directory the user cannot enter", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.Remove(ctx, as(tr.User.Name, &filesystem.RemoveRequest{Path: tr.Hidden}))
			return err
		}},
		{name: "move root's file into the home", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.Move(ctx, as(tr.User.Name, &filesystem.MoveRequest{Source: tr.Secret, Destination: filepath.Join(tr.Home, "stolen")}))
			return err
		}},
		{name: "move the user's file through a link to root's directory", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.Move(ctx, as(tr.User.Name, &filesystem.MoveRequest{Source: tr.LinkSecret, Destination: filepath.Join(tr.LinkDir, "x", "moved")}))
			return err
		}},
		{name: "watch a directory the user cannot enter", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			stream, err := c.WatchDir(ctx, as(tr.User.Name, &filesystem.WatchDirRequest{Path: tr.Private}))
			if err != nil {
				return err
			}
			defer stream.Close()
			for stream.Receive() {
				if stream.Msg().GetStart() != nil {
					return errors.New("watch started")
				}
			}
			return stream.Err()
		}},
		{name: "poll a directory the user cannot enter", call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
			_, err := c.CreateWatcher(ctx, as(tr.User.Name, &filesystem.CreateWatcherRequest{Path: tr.Private, Recursive: true}))
			return err
		}},
		{
			name: "make directories in the home",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
				_, err := c.MakeDir(ctx, as(tr.User.Name, &filesystem.MakeDirRequest{Path: filepath.Join(tr.Home, "a/b")}))
				return err
			},
			check: func(t *testing.T, tr *asusertest.Tree) {
				asusertest.CheckOwner(t, filepath.Join(tr.Home, "a"), tr.User.UID, tr.User.GID)
				asusertest.CheckOwner(t, filepath.Join(tr.Home, "a/b"), tr.User.UID, tr.User.GID)
			},
		},
		{
			name: "remove a link the user planted",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
				_, err := c.Remove(ctx, as(tr.User.Name, &filesystem.RemoveRequest{Path: tr.LinkDir}))
				return err
			},
			check: func(t *testing.T, tr *asusertest.Tree) {
				if _, err := os.Lstat(tr.LinkDir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("link still there: %v", err)
				}
				if err := os.Symlink(tr.RootDir, tr.LinkDir); err != nil { // for CheckUntouched
					t.Fatal(err)
				}
			},
		},
		{
			name: "list root's directory through a link",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *asusertest.Tree) error {
				_, err := c.ListDir(ctx, as(tr.User.Name, &filesystem.ListDirRequest{Path: tr.LinkDir}))
				return err
			},
			check: func(*testing.T, *asusertest.Tree) {},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := asusertest.New(t)
			client, _ := newTestServer(t)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err := tc.call(ctx, client, tr)
			if tc.check == nil {
				wantCode(t, err, connect.CodePermissionDenied)
			} else {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, tr)
			}
			tr.CheckUntouched(t)
			asusertest.CheckFile(t, tr.Mine, asusertest.MineContent, tr.User.UID, tr.User.GID, 0o640)
		})
	}
}

// TestWatchDirAsUser: a recursive watch acting as the user follows new
// directories in the user's home and reports their entries, but not a
// directory of root's there that the user may not read; such a directory
// stops a new watch at start.
func TestWatchDirAsUser(t *testing.T) {
	tr := asusertest.New(t)
	client, _ := newTestServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	u := tr.User
	stream := openWatch(t, ctx, client, as(u.Name, &filesystem.WatchDirRequest{Path: tr.Home, Recursive: true, IncludeEntry: true}))
	// A file written as root in a directory that appears with it.
	if err := os.MkdirAll(filepath.Join(tr.Home, "new", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(tr.Home, "new"), int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	ev, _ := waitEvent(t, stream, "new/deeper", filesystem.EventType_EVENT_TYPE_CREATE)
	if ev.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("entry = %v", ev.GetEntry())
	}
	if err := os.WriteFile(filepath.Join(tr.Home, "new", "deeper", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "new/deeper/f", filesystem.EventType_EVENT_TYPE_WRITE)

	// Root's 0700 directory appearing in the home is not watched, nor
	// listed: what root writes there stays unseen. The marker comes after.
	private := filepath.Join(tr.Home, "roots")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(private, "secret-name"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tr.Home, "marker"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, seen := waitEvent(t, stream, "marker", filesystem.EventType_EVENT_TYPE_WRITE)
	for _, ev := range seen {
		if strings.HasPrefix(ev.GetName(), "roots/") {
			t.Errorf("event in root's 0700 directory reached the user: %v", ev)
		}
	}

	// A new watch of the home cannot watch that directory: refused, as the
	// user's own inotify_add_watch would be.
	_, err := client.CreateWatcher(ctx, as(u.Name, &filesystem.CreateWatcherRequest{Path: tr.Home, Recursive: true}))
	wantCode(t, err, connect.CodePermissionDenied)
}
