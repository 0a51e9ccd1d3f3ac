package native

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// InitInC reports whether sandbox id's init, started by r, was done in C.
func (r *Runtime) InitInC(id string) bool {
	r.mu.Lock()
	c := r.live[id]
	r.mu.Unlock()
	return c != nil && c.InitInC()
}

// BaseMountinfo is the mountinfo of r's base mount namespace, or "" when
// it has none.
func (r *Runtime) BaseMountinfo() (string, error) {
	if r.baseNS == nil {
		return "", nil
	}
	type result struct {
		s   string
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- result{err: err}
			return
		}
		if err := unix.Setns(int(r.baseNS.Fd()), unix.CLONE_NEWNS); err != nil {
			done <- result{err: err}
			return
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		done <- result{string(b), err}
	}()
	res := <-done
	return res.s, res.err
}
