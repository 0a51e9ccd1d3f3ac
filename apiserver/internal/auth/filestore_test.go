package auth

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newFileStore(t *testing.T, path string, opts FileStoreOptions) *FileStore {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := NewFileStore(path, opts)
	if err != nil {
		t.Fatalf("NewFileStore: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes content to a temporary file beside path and renames it
// over path, as careful editors and config tools do.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func teamOf(s Store, key string) string {
	team, err := s.Team(context.Background(), key)
	if err != nil {
		return ""
	}
	return team
}

// eventually polls cond until it holds; the deadline only bounds a failure.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFileStoreTeam(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "team-a "+keyA+"\nteam-b "+keyB+"\n")
	s := newFileStore(t, path, FileStoreOptions{})
	for _, tt := range []struct {
		key, team string
	}{
		{keyA, "team-a"},
		{keyB, "team-b"},
		{keyC, ""},
		{"", ""},
		{"e2b_", ""},
		{strings.ToUpper(keyA), ""},
	} {
		team, err := s.Team(t.Context(), tt.key)
		if tt.team == "" {
			if !errors.Is(err, ErrUnknownKey) {
				t.Errorf("Team(%q) = %q, %v; want ErrUnknownKey", tt.key, team, err)
			}
			continue
		}
		if err != nil || team != tt.team {
			t.Errorf("Team(%q) = %q, %v; want %q", tt.key, team, err, tt.team)
		}
	}
}

func TestNewFileStoreRefusesBadFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewFileStore(filepath.Join(dir, "missing"), FileStoreOptions{}); err == nil {
		t.Error("NewFileStore(missing file) succeeded")
	}
	bad := filepath.Join(dir, "bad")
	writeFile(t, bad, "team-a "+keyA+"\nteam-b "+keyA+"\n")
	_, err := NewFileStore(bad, FileStoreOptions{})
	if err == nil || !strings.Contains(err.Error(), "lines 1 and 2") {
		t.Fatalf("NewFileStore(duplicate key) = %v, want an error naming lines 1 and 2", err)
	}
	assertNoSecret(t, err.Error(), "")
}

// Each way a file gets replaced must reach the store through change
// notifications alone (polling is off).
func TestFileStoreReloadsOnChange(t *testing.T) {
	const (
		before = "team-a " + keyA + "\n"
		after  = "team-b " + keyB + "\n"
	)
	for _, tt := range []struct {
		name string
		// setup writes before and returns the path to open and a func that
		// changes the content to the given text.
		setup func(t *testing.T, dir string) (string, func(content string))
	}{
		{"write in place", func(t *testing.T, dir string) (string, func(string)) {
			path := filepath.Join(dir, "keys")
			writeFile(t, path, before)
			return path, func(c string) { writeFile(t, path, c) }
		}},
		{"atomic rename", func(t *testing.T, dir string) (string, func(string)) {
			path := filepath.Join(dir, "keys")
			writeFile(t, path, before)
			return path, func(c string) { replaceFile(t, path, c) }
		}},
		{"secret volume symlink swap", func(t *testing.T, dir string) (string, func(string)) {
			// The kubelet's layout: keys -> ..data/keys, ..data -> ..<version>.
			// An update writes a new version directory, points ..data_tmp at
			// it, renames ..data_tmp over ..data and removes the old version.
			version := 0
			current := ""
			publish := func(c string) {
				version++
				next := filepath.Join(dir, "..v"+strings.Repeat("i", version))
				if err := os.Mkdir(next, 0o700); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(next, "keys"), c)
				tmp := filepath.Join(dir, "..data_tmp")
				if err := os.Symlink(filepath.Base(next), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
				if current != "" {
					if err := os.RemoveAll(current); err != nil {
						t.Fatal(err)
					}
				}
				current = next
			}
			publish(before)
			path := filepath.Join(dir, "keys")
			if err := os.Symlink(filepath.Join("..data", "keys"), path); err != nil {
				t.Fatal(err)
			}
			return path, publish
		}},
		{"symlink into another directory", func(t *testing.T, dir string) (string, func(string)) {
			// The watched name is a symlink; the file it names is edited
			// where it lives.
			target := filepath.Join(t.TempDir(), "real-keys")
			writeFile(t, target, before)
			path := filepath.Join(dir, "keys")
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
			return path, func(c string) { replaceFile(t, target, c) }
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path, change := tt.setup(t, t.TempDir())
			s := newFileStore(t, path, FileStoreOptions{PollInterval: -1})
			if got := teamOf(s, keyA); got != "team-a" {
				t.Fatalf("before: Team(keyA) = %q", got)
			}
			change(after)
			eventually(t, "keyB belongs to team-b", func() bool { return teamOf(s, keyB) == "team-b" })
			if got := teamOf(s, keyA); got != "" {
				t.Errorf("after: removed keyA still belongs to %q", got)
			}
			// A second change proves the watches survived the first.
			change(before + after)
			eventually(t, "keyA is back", func() bool { return teamOf(s, keyA) == "team-a" })
			if got := teamOf(s, keyB); got != "team-b" {
				t.Errorf("after second change: Team(keyB) = %q", got)
			}
		})
	}
}

func TestFileStorePollsWithoutNotifications(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "team-a "+keyA+"\n")
	s := newFileStore(t, path, FileStoreOptions{PollInterval: 10 * time.Millisecond, noWatch: true})
	replaceFile(t, path, "team-b "+keyB+"\n")
	eventually(t, "the poll loads keyB", func() bool { return teamOf(s, keyB) == "team-b" })
}

func TestFileStoreFailedReloadKeepsKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "team-a "+keyA+"\n")
	var mu sync.Mutex
	var reloads []error
	s := newFileStore(t, path, FileStoreOptions{PollInterval: -1, noWatch: true, OnReload: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reloads = append(reloads, err)
	}})
	reloadsSoFar := func() []error {
		mu.Lock()
		defer mu.Unlock()
		return append([]error(nil), reloads...)
	}

	// Unchanged content is no news.
	if err := s.Reload(); err != nil || len(reloadsSoFar()) != 0 {
		t.Fatalf("Reload(unchanged) = %v, OnReload calls %v", err, reloadsSoFar())
	}

	steps := []struct {
		name    string
		change  func()
		wantErr string // "" for success
		keyA    string // team of keyA afterwards
		keyB    string
	}{
		{"bad line", func() { writeFile(t, path, "team-a "+keyA+"\nteam-b "+keyB+" extra\n") }, "line 2", "team-a", ""},
		{"duplicate key", func() { writeFile(t, path, "team-b "+keyA+"\nteam-c "+keyA+"\n") }, "lines 1 and 2", "team-a", ""},
		{"file removed", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, "no such file", "team-a", ""},
		{"unreadable path", func() {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "is a directory", "team-a", ""},
		{"fixed", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			writeFile(t, path, "team-b "+keyB+"\n")
		}, "", "", "team-b"},
		{"emptied", func() { writeFile(t, path, "") }, "", "", ""},
	}
	for i, step := range steps {
		step.change()
		err := s.Reload()
		if step.wantErr == "" && err != nil || step.wantErr != "" && (err == nil || !strings.Contains(err.Error(), step.wantErr)) {
			t.Fatalf("%s: Reload() = %v, want %q", step.name, err, step.wantErr)
		}
		if err != nil {
			assertNoSecret(t, err.Error(), keyA+" "+keyB)
		}
		// The same failure again is neither reported nor logged twice.
		if again := s.Reload(); (again == nil) != (err == nil) {
			t.Fatalf("%s: second Reload() = %v, first %v", step.name, again, err)
		}
		if got := reloadsSoFar(); len(got) != i+1 || (got[i] == nil) != (err == nil) {
			t.Fatalf("%s: OnReload calls %v, want %d ending in %v", step.name, got, i+1, err)
		}
		if got := teamOf(s, keyA); got != step.keyA {
			t.Errorf("%s: Team(keyA) = %q, want %q", step.name, got, step.keyA)
		}
		if got := teamOf(s, keyB); got != step.keyB {
			t.Errorf("%s: Team(keyB) = %q, want %q", step.name, got, step.keyB)
		}
	}
}

// A bad write noticed by the watcher leaves the old keys in place, and the
// next good write replaces them.
func TestFileStoreWatcherSkipsBadContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "team-a "+keyA+"\n")
	failed := make(chan error, 10)
	s := newFileStore(t, path, FileStoreOptions{PollInterval: -1, OnReload: func(err error) {
		if err != nil {
			failed <- err
		}
	}})
	replaceFile(t, path, "team-b "+keyB+" trailing junk\n")
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "line 1") {
			t.Errorf("reload error %v does not name line 1", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the bad write was never noticed")
	}
	if got := teamOf(s, keyA); got != "team-a" {
		t.Fatalf("after a bad write Team(keyA) = %q, want the last good team-a", got)
	}
	replaceFile(t, path, "team-b "+keyB+"\n")
	eventually(t, "the good write loads keyB", func() bool { return teamOf(s, keyB) == "team-b" })
}

// Lookups never see a half-loaded key set while reloads run (run with -race).
func TestFileStoreConcurrentLookups(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	const stable = "team-a " + keyA + "\n"
	writeFile(t, path, stable)
	s := newFileStore(t, path, FileStoreOptions{PollInterval: time.Millisecond})

	var stop atomic.Bool
	var wg sync.WaitGroup
	var lookups atomic.Int64
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				if got := teamOf(s, keyA); got != "team-a" {
					t.Errorf("Team(keyA) = %q during reloads", got)
					return
				}
				if got := teamOf(s, keyB); got != "" && got != "team-b" {
					t.Errorf("Team(keyB) = %q during reloads", got)
					return
				}
				lookups.Add(1)
			}
		})
	}
	for i := range 200 {
		content := stable
		if i%2 == 0 {
			content += "team-b " + keyB + "\n"
		}
		replaceFile(t, path, content)
		if i%10 == 0 {
			_ = s.Reload()
		}
	}
	stop.Store(true)
	wg.Wait()
	if lookups.Load() == 0 {
		t.Fatal("no lookups ran")
	}
}

func TestFileStoreClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "team-a "+keyA+"\n")
	s, err := NewFileStore(path, FileStoreOptions{Logger: testLogger(t), PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Closed, the store stops following the file but still answers.
	replaceFile(t, path, "team-b "+keyB+"\n")
	if got := teamOf(s, keyA); got != "team-a" {
		t.Errorf("after Close Team(keyA) = %q, want team-a", got)
	}
}
