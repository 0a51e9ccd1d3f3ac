package native

import (
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This host's kernel (6.x, no filter around the tests) makes every system
// call the init in C uses: the probes must say so, or they would give
// every sandbox the Go init on hosts that need not.
func TestCInitSystemCallsAvailable(t *testing.T) {
	if errs := cInitUnavailable(); errs != nil {
		t.Errorf("the init in C cannot run here: %v", errs)
	}
}

// On a thread whose filter answers fsopen with ENOSYS, as an older kernel
// would, the probes name it.
func TestCInitSystemCallsRefused(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root (a seccomp filter without no_new_privs)")
	}
	errs := make(chan []error)
	go func() {
		// The filter stays on this thread, which ends with the goroutine.
		runtime.LockOSThread()
		filter := []unix.SockFilter{
			{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
			{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_FSOPEN},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		}
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
			t.Errorf("seccomp: %v", err)
			errs <- nil
			return
		}
		errs <- cInitUnavailable()
	}()
	got := <-errs
	if len(got) != 1 || !strings.Contains(got[0].Error(), "fsopen: function not implemented") {
		t.Errorf("probes under a filter refusing fsopen: %v, want fsopen alone", got)
	}
}
