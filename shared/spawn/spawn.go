// Package spawn starts child processes that end with this one: Linux's
// parent-death signal (PR_SET_PDEATHSIG) reaches them when it dies, even
// without running its cleanups (SIGKILL, a panic, go test's -timeout).
//
// The kernel sends that signal when the thread that forked the child ends,
// not the process, and the Go runtime ends a thread whenever a goroutine
// locked to it exits without unlocking, as code that enters a namespace
// on a throwaway thread does. Start therefore forks every child from one
// goroutine locked to its own thread, which never ends.
package spawn

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

type request struct {
	cmd  *exec.Cmd
	errc chan error
}

var (
	once     sync.Once
	requests chan request
)

// Start starts cmd as cmd.Start does, with sig as its parent-death signal:
// the child gets sig when this process ends. cmd.SysProcAttr's other
// fields are kept.
func Start(cmd *exec.Cmd, sig syscall.Signal) error {
	once.Do(func() {
		requests = make(chan request)
		go forker()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	r := request{cmd: cmd, errc: make(chan error, 1)}
	requests <- r
	return <-r.errc
}

// forker runs on a thread of its own for the life of the process: no other
// goroutine runs there, so none can end it.
func forker() {
	runtime.LockOSThread()
	for r := range requests {
		r.errc <- r.cmd.Start()
	}
}
