// Package asuser makes envd's filesystem calls with the identity of the user
// a request acts as.
//
// envd runs as root. A file request acting as another user must resolve
// and open paths as that user would, so that the kernel's permission checks
// apply: a symlink the user planted to /etc/shadow must fail as the user's
// own open would, and what it creates must be the user's without a chown.
// Do runs a function on a thread whose filesystem identity (fsuid, fsgid,
// supplementary groups) is the user's. Only that thread changes: the raw
// setfsuid, setfsgid and setgroups system calls act on the calling thread
// (syscall.Setuid and syscall.Setgroups would change every thread of envd).
// An fsuid other than 0 also drops the filesystem capabilities
// (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_CHOWN, …) from
// the thread's effective set; giving back fsuid 0 raises them again.
//
// A function given to Do should make the path-resolving calls (open,
// stat, mkdir, rename, unlink, xattrs, inotify watches) and return: reading
// or writing a file it opened needs no identity and can happen anywhere.
package asuser

import (
	"errors"
	"os"
	"runtime"

	"github.com/skiff-dev/skiff/envd/internal/harden"
	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// ErrSwitch is wrapped by the errors of a thread that could not take or give
// back an identity. Such errors do not wrap the system call's errno: an
// EPERM there is envd's failure, not the user's permission denied.
var ErrSwitch = errors.New("switch filesystem identity")

// The process's identity, which every thread has outside Do.
var (
	processUID = uint32(os.Geteuid())
	processGID = uint32(os.Getegid())
)

// Do runs fn with u's filesystem identity and returns its error. When u is
// envd's own user and group (root, for root's requests) fn runs at once, on
// the calling goroutine, as before. Otherwise it runs on a goroutine of its
// own, locked to an OS thread that takes u's identity and gives it back
// after; a panic in fn is raised again in the caller once the identity is
// given back. If the thread cannot give it back, the goroutine ends with the
// thread still locked, so the Go runtime ends that thread instead of running
// other goroutines with u's identity.
func Do(u *identity.User, fn func() error) error {
	if u.UID == processUID && u.GID == processGID {
		return fn()
	}
	done := make(chan outcome, 1)
	go func() { done <- onThread(u, fn) }()
	o := <-done
	if o.panicked {
		panic(o.value)
	}
	return o.err
}

// outcome is how fn ended on its thread.
type outcome struct {
	err      error
	panicked bool
	value    any // the panic's value
}

// onThread runs fn on the calling goroutine's thread, locked, with u's
// identity; it unlocks the thread only once the identity is given back.
func onThread(u *identity.User, fn func() error) (o outcome) {
	runtime.LockOSThread()
	saved, err := current()
	if err != nil {
		runtime.UnlockOSThread() // nothing was changed
		return outcome{err: err}
	}
	defer func() {
		if v := recover(); v != nil {
			o.panicked, o.value = true, v
		}
		if err := saved.apply(); err != nil {
			o.err = errors.Join(o.err, err)
			return // locked: the runtime ends the thread with this goroutine
		}
		// The kernel resets the process's dumpable flag on every
		// credential change; envd must stay non-dumpable.
		if err := harden.KeepNonDumpable(); err != nil {
			o.err = errors.Join(o.err, err)
		}
		runtime.UnlockOSThread()
	}()
	if err := become(u); err != nil {
		return outcome{err: err}
	}
	return outcome{err: fn()}
}

// become gives the thread u's identity: groups first, then fsgid, and fsuid
// last (setgroups and setfsgid need CAP_SETGID, which an fsuid change keeps,
// but the order keeps that question away).
func become(u *identity.User) error {
	if err := setGroups(u.Groups); err != nil {
		return err
	}
	if err := setFSGID(u.GID); err != nil {
		return err
	}
	return setFSUID(u.UID)
}

// threadIdentity is a thread's filesystem identity.
type threadIdentity struct {
	fsuid, fsgid uint32
	groups       []uint32
}

// current reads the calling thread's identity.
func current() (*threadIdentity, error) {
	groups, err := getGroups()
	if err != nil {
		return nil, err
	}
	return &threadIdentity{fsuid: fsuid(), fsgid: fsgid(), groups: groups}, nil
}

// apply gives the calling thread the identity: fsuid first, which raises the
// filesystem capabilities again when it is 0.
func (id *threadIdentity) apply() error {
	if err := setFSUID(id.fsuid); err != nil {
		return err
	}
	if err := setFSGID(id.fsgid); err != nil {
		return err
	}
	return setGroups(id.groups)
}
