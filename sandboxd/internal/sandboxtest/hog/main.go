// Command hog takes one kind of kernel resource until the kernel refuses
// more, for the tests that show one sandbox cannot take what other
// sandboxes and the host need. It is built static (sandboxtest.Hog) and run
// inside sandboxes, or on the host to check what is left there.
//
//	hog inotify N [hold]    inotify instances
//	hog sigpending N [hold] queued real-time signals (pending, blocked)
//	hog mqueue N [hold]     POSIX message queues of 80 KiB each
//	hog mem MiB [hold]      anonymous memory, touched
//	hog procs N [hold]      processes (sleep 600, from PATH)
//	hog threads N [hold]    threads, each blocked in the kernel
//	hog syscall NR[:ARG]... raw system calls, for the seccomp tests
//
// Each prints one line, "got=<how many> err=<what stopped it, or none>",
// and with "hold" then keeps what it took until it is killed (at most ten
// minutes, so a forgotten hog ends by itself). "syscall" prints, for each
// call, the name of the error it got or "none", on one line.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const maxHold = 10 * time.Minute

func main() {
	if len(os.Args) > 1 && os.Args[1] == "syscall" {
		syscalls(os.Args[2:])
		return
	}
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: hog inotify|sigpending|mqueue|mem N [hold]")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil || n < 0 {
		fmt.Fprintln(os.Stderr, "hog: N must be a count")
		os.Exit(2)
	}
	hold := len(os.Args) > 3 && os.Args[3] == "hold"
	take := map[string]func(int) (int, error){
		"inotify": inotify, "sigpending": sigpending, "mqueue": mqueue, "mem": mem, "procs": procs, "threads": threads,
	}[os.Args[1]]
	if take == nil {
		fmt.Fprintln(os.Stderr, "hog: unknown resource", os.Args[1])
		os.Exit(2)
	}
	got, err := take(n)
	msg := "none"
	if errno, ok := errors.AsType[unix.Errno](err); ok {
		msg = unix.ErrnoName(errno)
	} else if err != nil {
		msg = err.Error()
	}
	fmt.Printf("got=%d err=%s\n", got, msg)
	if hold {
		time.Sleep(maxHold)
	}
}

// syscalls makes each call of calls, NR or NR:ARG (numbers as strconv
// reads them: 0x for hexadecimal), with the other arguments zero.
func syscalls(calls []string) {
	var out []string
	for _, c := range calls {
		nr, arg, _ := strings.Cut(c, ":")
		n, err := strconv.ParseUint(nr, 0, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "hog: not a system call number:", nr)
			os.Exit(2)
		}
		var a uint64
		if arg != "" {
			if a, err = strconv.ParseUint(arg, 0, 64); err != nil {
				fmt.Fprintln(os.Stderr, "hog: not an argument:", arg)
				os.Exit(2)
			}
		}
		name := "none"
		if _, _, e := unix.RawSyscall6(uintptr(n), uintptr(a), 0, 0, 0, 0, 0); e != 0 {
			name = unix.ErrnoName(e)
		}
		out = append(out, name)
	}
	fmt.Println(strings.Join(out, " "))
}

func inotify(n int) (int, error) {
	for i := range n {
		if _, err := unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
			return i, err
		}
	}
	return n, nil
}

// sigpending queues signal rtSig to this thread, which blocks it, so each
// one stays pending and counts against RLIMIT_SIGPENDING.
func sigpending(n int) (int, error) {
	const rtSig = 40
	runtime.LockOSThread() // the mask and the queue are this thread's
	var set unix.Sigset_t
	set.Val[(rtSig-1)/64] |= 1 << ((rtSig - 1) % 64)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil); err != nil {
		return 0, err
	}
	var info [128]byte // siginfo_t: si_signo, si_errno, si_code (SI_QUEUE)
	*(*int32)(unsafe.Pointer(&info[0])) = rtSig
	*(*int32)(unsafe.Pointer(&info[8])) = -1
	pid, tid := uintptr(unix.Getpid()), uintptr(unix.Gettid())
	for i := range n {
		_, _, e := unix.RawSyscall6(unix.SYS_RT_TGSIGQUEUEINFO, pid, tid, rtSig, uintptr(unsafe.Pointer(&info[0])), 0, 0)
		if e != 0 {
			return i, e
		}
	}
	return n, nil
}

// mqueue opens message queues of 10 messages of 8 KiB each (the most an
// unprivileged process may ask for by default: 80 KiB, as RLIMIT_MSGQUEUE
// counts them, plus the kernel's overhead). Each is unlinked once open: it
// lives while this process does.
func mqueue(n int) (int, error) {
	attr := struct { // struct mq_attr
		flags, maxmsg, msgsize, curmsgs int64
		_                               [4]int64
	}{maxmsg: 10, msgsize: 8192}
	for i := range n {
		name, err := unix.BytePtrFromString(fmt.Sprintf("hog-%d-%d", os.Getpid(), i))
		if err != nil {
			return i, err
		}
		_, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)),
			unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600, uintptr(unsafe.Pointer(&attr)), 0, 0)
		if e != 0 {
			return i, e
		}
		_, _, _ = unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
	}
	return n, nil
}

// mem maps n MiB and writes every page of it.
func mem(n int) (int, error) {
	b, err := unix.Mmap(-1, 0, n<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE)
	if err != nil {
		return 0, err
	}
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 1
	}
	return n, nil
}

// procs starts n processes that sleep, as a fork bomb does, until the
// kernel refuses one. They outlive the hog.
func procs(n int) (int, error) {
	for i := range n {
		if err := exec.Command("sleep", "600").Start(); err != nil {
			return i, err
		}
	}
	return n, nil
}

// threads makes n threads, each a goroutine locked to its thread and
// blocked in pause(2). Go ends the whole process when the kernel refuses
// it a thread (a thread bomb ends itself at the limit, freeing its
// threads), so a refusal shows as the hog's death, not as a count.
func threads(n int) (int, error) {
	debug.SetMaxThreads(n + 100)
	started := make(chan struct{})
	for range n {
		go func() {
			runtime.LockOSThread()
			started <- struct{}{}
			_, _, _ = unix.Syscall(unix.SYS_PAUSE, 0, 0, 0)
		}()
		<-started
	}
	return n, nil
}
