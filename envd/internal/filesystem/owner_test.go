package filesystem

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/envd/internal/ensure/ensuretest"
	"github.com/skiff-dev/skiff/envd/proto/filesystem"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
)

// TestAsUserActsAsRoot: every RPC acting as an unprivileged user resolves
// and touches paths as e2b's envd does, as root, so it may do what root
// may; the directories it creates are the user's.
func TestAsUserActsAsRoot(t *testing.T) {
	type call func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error
	for _, tc := range []struct {
		name  string
		call  call
		check func(t *testing.T, tr *ensuretest.Tree)
	}{
		{
			name: "stat in a directory the user cannot enter",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				_, err := c.Stat(ctx, as(tr.User.Name, &filesystem.StatRequest{Path: tr.Hidden}))
				return err
			},
		},
		{
			name: "list a directory the user cannot enter",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				resp, err := c.ListDir(ctx, as(tr.User.Name, &filesystem.ListDirRequest{Path: tr.Private}))
				if err == nil && len(resp.Msg.GetEntries()) != 1 {
					return errors.New("want the one hidden file listed")
				}
				return err
			},
		},
		{
			name: "make directories through a link to root's directory",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				_, err := c.MakeDir(ctx, as(tr.User.Name, &filesystem.MakeDirRequest{Path: filepath.Join(tr.LinkDir, "a/b")}))
				return err
			},
			check: func(t *testing.T, tr *ensuretest.Tree) {
				ensuretest.CheckOwner(t, filepath.Join(tr.RootDir, "a"), tr.User.UID, tr.User.GID)
				ensuretest.CheckOwner(t, filepath.Join(tr.RootDir, "a/b"), tr.User.UID, tr.User.GID)
				ensuretest.CheckOwner(t, tr.RootDir, 0, 0)
			},
		},
		{
			name: "make directories in the home",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				_, err := c.MakeDir(ctx, as(tr.User.Name, &filesystem.MakeDirRequest{Path: filepath.Join(tr.Home, "a/b")}))
				return err
			},
			check: func(t *testing.T, tr *ensuretest.Tree) {
				ensuretest.CheckOwner(t, filepath.Join(tr.Home, "a"), tr.User.UID, tr.User.GID)
				ensuretest.CheckOwner(t, filepath.Join(tr.Home, "a/b"), tr.User.UID, tr.User.GID)
			},
		},
		{
			name: "remove a file in a directory the user cannot enter",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				_, err := c.Remove(ctx, as(tr.User.Name, &filesystem.RemoveRequest{Path: tr.Hidden}))
				return err
			},
			check: func(t *testing.T, tr *ensuretest.Tree) {
				if _, err := os.Lstat(tr.Hidden); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("file still there: %v", err)
				}
			},
		},
		{
			name: "move root's file into new directories of the home",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				_, err := c.Move(ctx, as(tr.User.Name, &filesystem.MoveRequest{Source: tr.Secret, Destination: filepath.Join(tr.Home, "x", "moved")}))
				return err
			},
			check: func(t *testing.T, tr *ensuretest.Tree) {
				// Moved as it is, root's; the new parent is the user's.
				ensuretest.CheckFile(t, filepath.Join(tr.Home, "x", "moved"), ensuretest.SecretContent, 0, 0, 0o600)
				ensuretest.CheckOwner(t, filepath.Join(tr.Home, "x"), tr.User.UID, tr.User.GID)
			},
		},
		{
			name: "poll a directory the user cannot enter",
			call: func(ctx context.Context, c filesystemconnect.FilesystemClient, tr *ensuretest.Tree) error {
				_, err := c.CreateWatcher(ctx, as(tr.User.Name, &filesystem.CreateWatcherRequest{Path: tr.Private, Recursive: true}))
				return err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := ensuretest.New(t)
			client, _ := newTestServer(t)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if err := tc.call(ctx, client, tr); err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, tr)
			}
		})
	}
}

// TestWatchDirAsUser: a recursive watch acting as the user follows new
// directories and reports their entries, root's 0700 ones too, as e2b's
// envd (root) watches them.
func TestWatchDirAsUser(t *testing.T) {
	tr := ensuretest.New(t)
	client, _ := newTestServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	u := tr.User
	stream := openWatch(t, ctx, client, as(u.Name, &filesystem.WatchDirRequest{Path: tr.Home, Recursive: true, IncludeEntry: true}))
	if err := os.MkdirAll(filepath.Join(tr.Home, "new", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	ev, _ := waitEvent(t, stream, "new/deeper", filesystem.EventType_EVENT_TYPE_CREATE)
	if ev.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("entry = %v", ev.GetEntry())
	}
	private := filepath.Join(tr.Home, "roots")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "roots", filesystem.EventType_EVENT_TYPE_CREATE)
	if err := os.WriteFile(filepath.Join(private, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, stream, "roots/f", filesystem.EventType_EVENT_TYPE_WRITE)
}
