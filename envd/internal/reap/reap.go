// Package reap makes envd a usable init. As PID 1 of a sandbox's pid
// namespace, envd inherits every orphan (`nohup sleep 100 &` from a shell
// that exits): unless it reaps them, their zombies pile up.
//
// envd also waits for the processes it starts itself, through os/exec, and
// a blind wait4(-1) would steal their exit statuses. So the reaper looks at
// a zombie before reaping it (waitid with WNOWAIT): a process registered
// through Spawn is left to its owner's Wait; anything else is reaped. Spawn
// holds off the reaper while it forks and registers, so a child that exits
// at once is never mistaken for an orphan, and a zombie's pid cannot be
// reused before it is reaped.
//
// This costs nothing at startup, unlike a separate init process that would
// re-execute envd (about one more exec of envd, 15-20 ms on a loaded
// 2-vCPU VM).
package reap

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reaper reaps the zombies of processes envd did not start. A nil *Reaper
// reaps nothing and Spawn only starts.
type Reaper struct {
	// gate is held shared by Spawn from fork to registration, and
	// exclusively by the reaper from looking a zombie up to reaping it.
	gate  sync.RWMutex
	mu    sync.Mutex
	owned map[int]chan struct{} // closed once the owner's Wait returned

	subreaper bool
	reaped    atomic.Uint64
	sigc      chan os.Signal
	stop      chan struct{}
	done      chan struct{}
}

// Start starts reaping orphans. As PID 1 the kernel hands them to this
// process already; otherwise it becomes a child subreaper
// (PR_SET_CHILD_SUBREAPER), so that the orphans of its descendants come to it
// rather than to the host's init.
func Start() (*Reaper, error) {
	r := &Reaper{
		owned: map[int]chan struct{}{},
		sigc:  make(chan os.Signal, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, os.NewSyscallError("prctl(PR_SET_CHILD_SUBREAPER)", err)
		}
		r.subreaper = true
	}
	signal.Notify(r.sigc, syscall.SIGCHLD)
	go r.loop()
	return r, nil
}

// Subreaper reports whether the reaper made this process a child subreaper
// (it is not PID 1).
func (r *Reaper) Subreaper() bool { return r != nil && r.subreaper }

// Reaped is how many orphans have been reaped.
func (r *Reaper) Reaped() uint64 {
	if r == nil {
		return 0
	}
	return r.reaped.Load()
}

// Spawn runs start, which forks one child and returns its pid, and leaves
// that child's exit to its owner: the caller must call release once its
// Wait for the child returned. When start fails, nothing is to be released.
func (r *Reaper) Spawn(start func() (int, error)) (release func(), err error) {
	if r == nil {
		_, err := start()
		return func() {}, err
	}
	r.gate.RLock()
	defer r.gate.RUnlock()
	pid, err := start()
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	r.mu.Lock()
	r.owned[pid] = ch
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			if r.owned[pid] == ch {
				delete(r.owned, pid)
			}
			r.mu.Unlock()
			close(ch)
		})
	}, nil
}

func (r *Reaper) loop() {
	defer close(r.done)
	for {
		if !r.reapAll() {
			return
		}
		select {
		case <-r.sigc:
		case <-r.stop:
			return
		}
	}
}

// reapAll reaps every orphan that is a zombie now. It returns false when the
// reaper is stopping.
func (r *Reaper) reapAll() bool {
	for {
		pid, err := peek()
		if err != nil || pid == 0 {
			return true // ECHILD (no children), or none has exited
		}
		r.gate.Lock()
		r.mu.Lock()
		ch, owned := r.owned[pid]
		r.mu.Unlock()
		if !owned {
			var ws syscall.WaitStatus
			if wpid, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); wpid == pid {
				r.reaped.Add(1)
			}
		}
		r.gate.Unlock()
		if owned {
			// Its owner's Wait reaps it; until then waitid shows it
			// first.
			select {
			case <-ch:
			case <-r.stop:
				return false
			}
		}
	}
}

// siginfo is Linux's siginfo_t, 128 bytes; siPid is where waitid puts the
// child's pid: after signo, errno and code, at the union, which is aligned
// for a pointer.
type siginfo [128 / 8]uint64

const siPid = (3*4 + unsafe.Sizeof(uintptr(0)) - 1) &^ (unsafe.Sizeof(uintptr(0)) - 1)

// peek returns the pid of a child that has exited, without reaping it, or 0
// when none has. Only children that signal SIGCHLD when they exit count,
// which every process and every orphan does; not the CLONE_VFORK probe
// children of Go's runtime.
func peek() (int, error) {
	for {
		var info siginfo // zeroed: with WNOHANG and no zombie, the pid stays 0
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info)),
			unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(*(*int32)(unsafe.Add(unsafe.Pointer(&info), siPid))), nil
	}
}

// Close stops reaping. A subreaper also kills the orphans it adopted (and
// reaps them), since they would otherwise go on under the host's init; PID 1
// leaves that to the kernel, which kills the whole pid namespace when it
// exits. The processes registered through Spawn are their owners' to stop.
func (r *Reaper) Close() {
	if r == nil {
		return
	}
	signal.Stop(r.sigc)
	close(r.stop)
	<-r.done
	if !r.subreaper {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r.gate.Lock()
		r.mu.Lock()
		left := 0
		for _, pid := range children() {
			if _, owned := r.owned[pid]; owned {
				continue
			}
			left++
			_ = syscall.Kill(pid, syscall.SIGKILL)
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, 0, nil)
		}
		r.mu.Unlock()
		r.gate.Unlock()
		if left == 0 {
			break
		}
	}
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
}

// children lists the pids whose parent is this process, from /proc.
func children() []int {
	self := os.Getpid()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(pid); err == nil && ppid == self {
			out = append(out, pid)
		}
	}
	return out
}

// parentOf reads a process's parent pid from /proc/<pid>/stat.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, errors.New("malformed stat")
	}
	return strconv.Atoi(f[1])
}
