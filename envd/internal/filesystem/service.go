// Package filesystem implements envd's filesystem.Filesystem Connect service:
// stat, mkdir, move, list and remove, plus directory watches as a server
// stream (WatchDir) or as polled watchers (CreateWatcher and friends).
//
// As in e2b's envd, every path is resolved and touched as root (envd's own
// identity), whichever user the request acts as; the directories it
// creates are given to that user (package ensure).
package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/ensure"
	"github.com/skiff-dev/skiff/envd/internal/entry"
	"github.com/skiff-dev/skiff/envd/internal/identity"
	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/envd/proto/filesystem"
	"github.com/skiff-dev/skiff/envd/proto/filesystem/filesystemconnect"
)

// Service implements filesystemconnect.FilesystemHandler. Create it with New
// and stop its watchers with Close.
type Service struct {
	sb *state.Sandbox

	mu       sync.Mutex
	closed   bool
	watchers map[string]*watcher // every live watcher: streamed and polled
	polled   map[string]*pollQueue
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// New returns a Service acting for the users of sb.
func New(sb *state.Sandbox) *Service {
	return &Service{
		sb:       sb,
		watchers: make(map[string]*watcher),
		polled:   make(map[string]*pollQueue),
	}
}

// Close stops every watcher, streamed or polled; open WatchDir streams end.
// Later watch requests fail with unavailable.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	ws := make([]*watcher, 0, len(s.watchers))
	for _, w := range s.watchers {
		ws = append(ws, w)
	}
	clear(s.watchers)
	clear(s.polled)
	s.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
}

// requestUser resolves the Basic-auth user of req, or the default user.
func (s *Service) requestUser(req connect.AnyRequest) (*identity.User, error) {
	u, err := s.sb.RequestUser(req.Header())
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return u, nil
}

// resolve resolves the user of req and p for that user.
func (s *Service) resolve(req connect.AnyRequest, p string) (string, *identity.User, error) {
	return s.resolveBy(req, p, identity.ResolvePath)
}

// resolveRead is resolve for a request that only reads (Stat, ListDir, the
// watches): an empty path means the default workdir, else the user's home.
// Requests that change anything use resolve, which refuses it.
func (s *Service) resolveRead(req connect.AnyRequest, p string) (string, error) {
	p, _, err := s.resolveBy(req, p, func(p string, u *identity.User) (string, error) {
		return identity.ResolveReadPath(p, u, s.sb.Workdir())
	})
	return p, err
}

// resolveBy is the requesting user and p resolved for them by resolvePath;
// a path it refuses is invalid_argument.
func (s *Service) resolveBy(req connect.AnyRequest, p string, resolvePath func(string, *identity.User) (string, error)) (string, *identity.User, error) {
	u, err := s.requestUser(req)
	if err != nil {
		return "", nil, err
	}
	abs, err := resolvePath(p, u)
	if err != nil {
		return "", nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid path '%s': %w", p, err))
	}
	return abs, u, nil
}

// osError maps a filesystem error to a Connect error: not-exist → not_found,
// exist → already_exists, permission → permission_denied, anything else →
// internal. The message keeps err's text ("file not found: lstat /x: …").
func osError(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("file not found: %w", err))
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("file already exists: %w", err))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("permission denied: %w", err))
	default:
		return connect.NewError(connect.CodeInternal, fmt.Errorf("filesystem error: %w", err))
	}
}

// Stat describes one entry (see entry.Info). An empty path is the default
// workdir, else the user's home.
func (s *Service) Stat(_ context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	p, err := s.resolveRead(req, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entry.Info(p)
	if err != nil {
		return nil, osError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its missing parents, owned by the user.
func (s *Service) MakeDir(_ context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	p, u, err := s.resolve(req, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := makeDir(p, u)
	if err != nil {
		return nil, osError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// makeDir is MakeDir's work.
func makeDir(p string, u *identity.User) (*filesystem.EntryInfo, error) {
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", p))
	}
	created, err := ensure.Dirs(p, u)
	if err != nil {
		if errors.Is(err, syscall.ENOTDIR) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("make dir %s: %w", p, err))
		}
		return nil, osError(err)
	}
	if !created {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", p))
	}
	return entry.Info(p)
}

// Move renames source to destination, creating the destination's missing
// parents, owned by the user.
func (s *Service) Move(_ context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	src, u, err := s.resolve(req, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := identity.ResolvePath(req.Msg.GetDestination(), u)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid path '%s': %w", req.Msg.GetDestination(), err))
	}
	e, err := move(src, dst, u)
	if err != nil {
		return nil, osError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// move is Move's work.
func move(src, dst string, u *identity.User) (*filesystem.EntryInfo, error) {
	if _, err := os.Lstat(src); err != nil {
		return nil, err
	}
	if _, err := ensure.Dirs(filepath.Dir(dst), u); err != nil {
		if errors.Is(err, syscall.ENOTDIR) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("create parent of %s: %w", dst, err))
		}
		return nil, err
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, err
	}
	return entry.Info(dst)
}

// ListDir lists a directory recursively up to depth (0 means 1), without
// following symlinks below it and without the directory itself. A symlink
// given as the path is followed, and entries are named under the path as
// given (/a/link/x, not /b/x for link → /b), as e2b's envd names them.
func (s *Service) ListDir(_ context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	p, err := s.resolveRead(req, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	entries, err := listDir(p, depth)
	if err != nil {
		return nil, osError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

// listDir is ListDir's work.
func listDir(p string, depth int) ([]*filesystem.EntryInfo, error) {
	root, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", p))
	}
	var entries []*filesystem.EntryInfo
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return err
			}
			return nil // an unreadable subdirectory or a vanished entry: skip it
		}
		if path == root {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		level := strings.Count(rel, string(filepath.Separator)) + 1
		e, ierr := entry.Info(path)
		if ierr == nil {
			e.Path = filepath.Join(p, rel)
			entries = append(entries, e)
		}
		if d.IsDir() && level >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	return entries, err
}

// Remove deletes a path recursively; a missing path is not an error.
func (s *Service) Remove(_ context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	p, _, err := s.resolve(req, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, osError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
