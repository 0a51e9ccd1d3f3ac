package process

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

// canTrace's probe answers true where a child may ask to be traced (the
// hosts the tests run on, unless Yama forbids all tracing), executes
// nothing, and leaves no child behind.
func TestCanTrace(t *testing.T) {
	if scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(scope)) == "3" {
		t.Skip("Yama forbids tracing here")
	}
	if !canTrace() {
		t.Fatal("canTrace() = false on a host that allows PTRACE_TRACEME")
	}
	var ws syscall.WaitStatus
	if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG|syscall.WALL, nil); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("the probe left a child: wait4 = %d, %v (%v)", pid, err, ws)
	}
}
