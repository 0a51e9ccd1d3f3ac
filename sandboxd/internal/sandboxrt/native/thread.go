package native

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// onThrowawayThread runs fn on a new goroutine locked to its thread and
// waits for its result. The thread is never unlocked, so it ends with the
// goroutine: fn may leave it in another namespace (or with another root or
// working directory) and no other goroutine ever runs there. The main
// thread is not such a thread: this package's init keeps the main
// goroutine on it (basens.go).
func onThrowawayThread[T any](fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		v, err := fn()
		done <- result{v, err}
	}()
	r := <-done
	return r.v, r.err
}

// enterMountNS moves the calling thread, which must be a throwaway one
// (onThrowawayThread), into the mount namespace held by ns. It first gives
// the thread a filesystem context of its own (root, working directory), as
// setns requires of a thread of a process with others.
func enterMountNS(ns *os.File) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	return nil
}
