package native

import (
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// TestNewUsernsWhileThreadsEnd: the helper that owns a new user namespace
// lives until it has answered, even while other goroutines lock threads
// and end with them (as namespace switches do), which ends the thread that
// started it, and with it the helper (Pdeathsig), unless that thread is
// held.
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
