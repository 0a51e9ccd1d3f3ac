package native

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// TestNewUsernsWhileThreadsEnd: the owner of a new user namespace lives
// until it has answered, even while other goroutines lock threads and end
// with them (as namespace switches do). Its parent-death signal fires when
// the thread that cloned it ends, not the process: that thread must be held
// (the cgo call holds it) until the owner is done.
func TestNewUsernsWhileThreadsEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base := hosttest.UIDBase()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				done := make(chan struct{})
				go func() {
					runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
					close(done)
				}()
				<-done
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for i := range 60 {
		f, err := newUserns(base)
		if err != nil {
			t.Fatalf("user namespace %d: %v", i, err)
		}
		_ = f.Close()
	}
}

// TestNewUserns: each namespace belongs to its sandbox's host uid (its
// owner is a clone of this process that shares its memory), many are made
// at once, no clone is left behind, and this process stays dumpable,
// although each clone's change of uid clears that for the memory they
// share.
func TestNewUserns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base := hosttest.UIDBase()
	before, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 25 {
				f, err := newUserns(base)
				if err != nil {
					t.Errorf("user namespace %d of goroutine %d: %v", i, g, err)
					return
				}
				var uid uint32
				const nsGetOwnerUID = 0xb704 // NS_GET_OWNER_UID, <linux/nsfs.h>
				if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&uid))); e != 0 {
					t.Errorf("NS_GET_OWNER_UID: %v", e)
				} else if uid != base {
					t.Errorf("the namespace is owned by uid %d, want %d", uid, base)
				}
				_ = f.Close()
			}
		})
	}
	wg.Wait()
	if after, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || after != before {
		t.Errorf("dumpable = %d, %v after; %d before", after, err, before)
	}
	if pid, err := unix.Wait4(-1, nil, unix.WNOHANG|unix.WALL, nil); !errors.Is(err, unix.ECHILD) {
		t.Errorf("wait4 = %d, %v: a child is left", pid, err)
	}
}

// A failure names its step: a range past the last uid is refused when its
// map is written.
func TestNewUsernsError(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	f, err := newUserns(1<<32 - 2 - idRange/2)
	if err == nil {
		f.Close()
		t.Fatal("a namespace mapping past uid 4294967294 was made")
	}
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "write uid_map") {
		t.Errorf("err = %v; want EINVAL from writing uid_map", err)
	}
}

// BenchmarkNewUserns: one sandbox's user namespace, made and closed.
func BenchmarkNewUserns(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	base := hosttest.UIDBase()
	for b.Loop() {
		f, err := newUserns(base)
		if err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
	}
}
