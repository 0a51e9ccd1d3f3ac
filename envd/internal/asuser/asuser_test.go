package asuser

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/asuser/asusertest"
	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// threadCreds is what /proc shows of one thread's credentials.
type threadCreds struct {
	fsuid, fsgid uint32
	groups       []uint32
}

// readCreds parses the Uid, Gid and Groups lines of a /proc status file.
func readCreds(status string) (threadCreds, error) {
	var c threadCreds
	b, err := os.ReadFile(status)
	if err != nil {
		return c, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		key, value, _ := strings.Cut(line, ":")
		if key != "Uid" && key != "Gid" && key != "Groups" {
			continue
		}
		var ids []uint32
		for _, f := range strings.Fields(value) {
			n, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return c, fmt.Errorf("%s: %q: %w", status, line, err)
			}
			ids = append(ids, uint32(n))
		}
		switch key {
		case "Uid":
			c.fsuid = ids[3] // real, effective, saved, filesystem
		case "Gid":
			c.fsgid = ids[3]
		case "Groups":
			c.groups = ids
		}
	}
	return c, nil
}

// threadCredsOf reads the calling thread's credentials; any goroutine may
// call it (it reports with t.Error).
func threadCredsOf(t *testing.T) threadCreds {
	c, err := readCreds("/proc/thread-self/status")
	if err != nil {
		t.Error(err)
	}
	return c
}

// checkAllThreadsAreTheProcess fails the test unless every thread of the
// process but skip (a thread id) has the process's identity. Any goroutine
// may call it.
func checkAllThreadsAreTheProcess(t *testing.T, want threadCreds, skip int) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Error(err)
		return
	}
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || tid == skip {
			continue
		}
		c, err := readCreds(filepath.Join("/proc/self/task", e.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		if c.fsuid != want.fsuid || c.fsgid != want.fsgid || !slices.Equal(c.groups, want.groups) {
			t.Errorf("thread %d has fsuid %d fsgid %d groups %v, want the process's %d %d %v", tid, c.fsuid, c.fsgid, c.groups, want.fsuid, want.fsgid, want.groups)
		}
	}
}

// TestDoTakesTheUsersIdentityOnItsThreadOnly: fn runs with the user's
// fsuid, fsgid and groups and without root's file capabilities, while every
// other thread keeps the process's identity, during and after.
func TestDoTakesTheUsersIdentityOnItsThreadOnly(t *testing.T) {
	tr := asusertest.New(t)
	u := tr.User
	process := threadCredsOf(t)
	var inside threadCreds
	var openErr error
	created := filepath.Join(tr.Home, "created")
	err := Do(u, func() error {
		inside = threadCredsOf(t)
		checkAllThreadsAreTheProcess(t, process, syscall.Gettid())
		f, err := os.Open(tr.Secret)
		if err == nil {
			f.Close()
		}
		openErr = err
		return os.WriteFile(created, nil, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside.fsuid != u.UID || inside.fsgid != u.GID || !slices.Equal(inside.groups, u.Groups) {
		t.Errorf("inside: fsuid %d fsgid %d groups %v, want %d %d %v", inside.fsuid, inside.fsgid, inside.groups, u.UID, u.GID, u.Groups)
	}
	if !errors.Is(openErr, fs.ErrPermission) {
		t.Errorf("open of root's 0600 file as the user: %v, want permission denied", openErr)
	}
	asusertest.CheckOwner(t, created, u.UID, u.GID)
	checkAllThreadsAreTheProcess(t, process, -1)
}

// TestDoAsTheProcessUserRunsInPlace: root's requests are made as before.
func TestDoAsTheProcessUserRunsInPlace(t *testing.T) {
	self := &identity.User{Name: "self", UID: processUID, GID: processGID}
	process := threadCredsOf(t)
	var inside threadCreds
	if err := Do(self, func() error {
		inside = threadCredsOf(t)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside.fsuid != process.fsuid || inside.fsgid != process.fsgid {
		t.Errorf("inside: %+v, want the process's %+v", inside, process)
	}
	want := errors.New("fn's error")
	if err := Do(self, func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Do = %v, want fn's error", err)
	}
}

// TestDoConcurrent: many users' calls at once leave every thread as it was.
func TestDoConcurrent(t *testing.T) {
	tr := asusertest.New(t)
	process := threadCredsOf(t)
	nobody, err := identity.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	var wg sync.WaitGroup
	for i := range 64 {
		u := tr.User
		if i%2 == 1 {
			u = nobody
		}
		wg.Go(func() {
			err := Do(u, func() error {
				if c := threadCredsOf(t); c.fsuid != u.UID || c.fsgid != u.GID {
					t.Errorf("fsuid %d fsgid %d, want %d %d", c.fsuid, c.fsgid, u.UID, u.GID)
				}
				_, err := os.Stat(tr.Hidden)
				if !errors.Is(err, fs.ErrPermission) {
					t.Errorf("stat in root's 0700 directory: %v, want permission denied", err)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	checkAllThreadsAreTheProcess(t, process, -1)
}

// TestDoPanic: a panic in fn reaches the caller, after the identity is
// given back.
func TestDoPanic(t *testing.T) {
	tr := asusertest.New(t)
	process := threadCredsOf(t)
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want boom", v)
			}
		}()
		_ = Do(tr.User, func() error { panic("boom") })
		t.Error("Do returned")
	}()
	checkAllThreadsAreTheProcess(t, process, -1)
}

// TestDoSwitchFails: an identity the thread cannot take is ErrSwitch, fn
// does not run, and the thread is given back what it had.
func TestDoSwitchFails(t *testing.T) {
	tr := asusertest.New(t)
	process := threadCredsOf(t)
	u := *tr.User
	u.Groups = make([]uint32, 1<<16+1) // more than NGROUPS_MAX
	ran := false
	err := Do(&u, func() error { ran = true; return nil })
	if !errors.Is(err, ErrSwitch) || errors.Is(err, fs.ErrPermission) {
		t.Errorf("Do = %v, want ErrSwitch (and not a permission error)", err)
	}
	if ran {
		t.Error("fn ran without the user's identity")
	}
	checkAllThreadsAreTheProcess(t, process, -1)
}

// TestDoWithoutFSIDs: where the kernel has no setfsuid and setfsgid
// (gVisor's), the thread's effective ids stand in for them, with the same
// results, and every thread but the one in Do keeps the process's identity.
func TestDoWithoutFSIDs(t *testing.T) {
	had := haveFSIDs
	haveFSIDs = false
	t.Cleanup(func() { haveFSIDs = had })
	t.Run("identity", TestDoTakesTheUsersIdentityOnItsThreadOnly)
	t.Run("concurrent", TestDoConcurrent)
	t.Run("panic", TestDoPanic)
	t.Run("switch fails", TestDoSwitchFails)
	// Back from the user, the thread has root's effective capabilities
	// again: it reads a 0600 file of another user.
	tr := asusertest.New(t)
	if err := Do(tr.User, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(tr.Secret); err != nil {
		t.Errorf("after Do, the process cannot read root's file: %v", err)
	}
}
