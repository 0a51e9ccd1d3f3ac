package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// DefaultPollInterval is how often a FileStore re-reads its file in case
	// a change notification was missed.
	DefaultPollInterval = 10 * time.Second

	// A burst of file events (an editor's save, a secret-volume swap) is
	// read once it has been quiet for settleDelay, and at the latest
	// maxSettle after its first event.
	settleDelay = 100 * time.Millisecond
	maxSettle   = time.Second
)

// FileStoreOptions tune a FileStore. The zero value is ready to use.
type FileStoreOptions struct {
	// PollInterval is how often the file is re-read regardless of change
	// notifications, which some file systems (NFS, FUSE) never send and
	// which stop when the watched directory itself is replaced. Zero means
	// DefaultPollInterval; a negative value turns polling off.
	PollInterval time.Duration
	// Logger receives reloads and reload failures; nil means slog.Default().
	Logger *slog.Logger
	// OnReload, if set, is called after each reload that loaded new keys
	// (err == nil) or failed (err != nil), once per distinct failure, and
	// once with nil when the file is good again. It is called from the
	// store's goroutine or from Reload, never with a lock held.
	OnReload func(err error)

	// noWatch turns file notifications off, so tests reach the polling
	// fallback alone.
	noWatch bool
}

// FileStore is a Store backed by a keys file, for installations without
// Kubernetes (the --api-keys-file flag).
//
// The file holds one `team key` pair per line; `#` starts a comment and blank
// lines are ignored. The team is a namespace name (an RFC 1123 label), the
// key has the shape ValidKey checks. A key listed for two teams makes the
// whole file invalid; the error names both line numbers and, like every error
// here, never quotes a key.
//
// The store holds only the keys' SHA-256 digests. It notices changes through
// file-system notifications on the file's directory (and on the directory of
// the file a symlink points to), which covers writes in place, an editor's
// write-and-rename, and the symlink swap with which the kubelet updates a
// Secret or ConfigMap volume; and it re-reads the file every PollInterval in
// case a notification was missed. A reload that fails (the file is missing,
// unreadable, or has a bad line) is logged, and the store keeps serving the
// last good keys; to revoke every key, write an empty file.
//
// Replace the file atomically (write a temporary file, then rename it over the
// old one) where you can: a reader that catches a write in place half way
// sees a shorter file, which is valid and lacks the keys not yet written,
// until the write completes moments later.
type FileStore struct {
	path     string
	log      *slog.Logger
	onReload func(error)
	keys     atomic.Pointer[keySet]

	// mu serializes reloads and guards the fields below it.
	mu      sync.Mutex
	loaded  [sha256.Size]byte // digest of the content keys came from
	failure string            // identifies the last failure, "" when good
	lastErr error

	watcher   *fsnotify.Watcher
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

var _ Store = (*FileStore)(nil)

// NewFileStore loads the keys file at path and starts watching it. It fails if
// the file cannot be read or parsed, so a bad file stops a server at start
// instead of locking every client out. Close stops the watching.
func NewFileStore(path string, opts FileStoreOptions) (*FileStore, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolve keys file path: %w", err)
	}
	s := &FileStore{path: abs, log: opts.Logger, onReload: opts.OnReload, done: make(chan struct{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("read keys file: %w", err)
	}
	set, err := parseKeysFile(data)
	if err != nil {
		return nil, fmt.Errorf("parse keys file %s: %w", abs, err)
	}
	s.keys.Store(set)
	s.loaded = sha256.Sum256(data)
	s.log.Info("keys file loaded", "path", abs, "keys", set.n)

	if !opts.noWatch {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			s.log.Warn("keys file: no change notifications, polling only", "path", abs, "error", err)
		} else {
			s.watcher = w
			s.syncWatches()
		}
	}
	poll := opts.PollInterval
	if poll == 0 {
		poll = DefaultPollInterval
	}
	s.wg.Go(func() { s.run(poll) })
	return s, nil
}

// Team implements Store.
func (s *FileStore) Team(_ context.Context, key string) (string, error) {
	if team, ok := s.keys.Load().team(key); ok {
		return team, nil
	}
	return "", ErrUnknownKey
}

// Reload re-reads the file now (a server may call it on SIGHUP). It returns
// the reason the file's current content is not being served, or nil.
func (s *FileStore) Reload() error {
	changed, err := s.reload()
	if changed && s.onReload != nil {
		s.onReload(err)
	}
	return err
}

// Close stops watching the file and waits for the store's goroutine to end.
// Lookups keep answering from the last good keys.
func (s *FileStore) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.done)
		s.wg.Wait()
		if s.watcher != nil {
			err = s.watcher.Close()
		}
	})
	return err
}

// reload reads and, if its content changed, parses the file. changed says
// whether the outcome is news: new keys, a new failure, or a recovery.
func (s *FileStore) reload() (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path)
	if err != nil {
		return s.fail("read:"+err.Error(), fmt.Errorf("read keys file: %w", err))
	}
	d := sha256.Sum256(data)
	if d == s.loaded {
		if s.failure == "" {
			return false, nil
		}
		s.failure, s.lastErr = "", nil
		s.log.Info("keys file is back to the content being served", "path", s.path)
		return true, nil
	}
	id := fmt.Sprintf("content:%x", d)
	if id == s.failure {
		return false, s.lastErr
	}
	set, err := parseKeysFile(data)
	if err != nil {
		return s.fail(id, fmt.Errorf("parse keys file %s: %w", s.path, err))
	}
	s.keys.Store(set)
	s.loaded, s.failure, s.lastErr = d, "", nil
	s.log.Info("keys file reloaded", "path", s.path, "keys", set.n)
	return true, nil
}

// fail records a failed reload; it logs each distinct failure once.
func (s *FileStore) fail(id string, err error) (bool, error) {
	if id == s.failure {
		return false, s.lastErr
	}
	s.failure, s.lastErr = id, err
	s.log.Error("keys file reload failed; serving the last good keys", "path", s.path, "error", err)
	return true, err
}

// run reloads on file events (once they settle) and on every poll tick,
// until Close.
func (s *FileStore) run(poll time.Duration) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if s.watcher != nil {
		events, errs = s.watcher.Events, s.watcher.Errors
	}
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	settle := time.NewTimer(settleDelay)
	settle.Stop()
	defer settle.Stop()
	var first time.Time // first event of the pending burst; zero if none
	pending := func() {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		if now.Sub(first) < maxSettle-settleDelay {
			settle.Reset(settleDelay)
		}
	}
	for {
		select {
		case <-s.done:
			return
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// Any event in a watched directory may concern the file: the
			// kubelet swaps a "..data" symlink, editors rename other names
			// onto it. Reading is cheap and unchanged content is skipped.
			pending()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// Usually an overflow: events were lost, so look again.
			s.log.Warn("keys file watch error", "path", s.path, "error", err)
			pending()
		case <-settle.C:
			first = time.Time{}
			_ = s.Reload()
			s.syncWatches()
		case <-tick:
			_ = s.Reload()
			s.syncWatches()
		}
	}
}

// syncWatches watches the file's directory and, if the file is a symlink,
// the directory of its target, which can change with every reload.
func (s *FileStore) syncWatches() {
	if s.watcher == nil {
		return
	}
	want := []string{filepath.Dir(s.path)}
	if target, err := filepath.EvalSymlinks(s.path); err == nil {
		if dir := filepath.Dir(target); dir != want[0] {
			want = append(want, dir)
		}
	}
	have := s.watcher.WatchList()
	for _, dir := range have {
		if !slices.Contains(want, dir) {
			_ = s.watcher.Remove(dir) // it may be gone already
		}
	}
	for _, dir := range want {
		if slices.Contains(have, dir) {
			continue
		}
		if err := s.watcher.Add(dir); err != nil {
			s.log.Debug("keys file: cannot watch directory; polling covers it", "dir", dir, "error", err)
		}
	}
}
