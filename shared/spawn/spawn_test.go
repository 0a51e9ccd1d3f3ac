package spawn

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive reports whether pid runs: a zombie (not reaped yet) does not.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(after, "Z")
}

// startOnThrowawayThread starts a sleep(1) from a goroutine locked to its
// thread that then exits locked, so that the Go runtime ends the thread,
// as code that enters a namespace on a throwaway thread does. The main
// thread is never ended (the runtime wedges it instead), so a start that
// ran there is tried again on another.
func startOnThrowawayThread(t *testing.T, start func(*exec.Cmd) error) *exec.Cmd {
	t.Helper()
	for range 10 {
		cmd := exec.Command("sleep", "60")
		type result struct {
			tid int
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends here
			err := start(cmd)
			done <- result{syscall.Gettid(), err}
		}()
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if r.tid != os.Getpid() {
			return cmd
		}
	}
	t.Fatal("every start ran on the main thread")
	return nil
}

// A child started from a thread that then ends gets its parent-death
// signal at once; one started through Start does not.
func TestAChildOutlivesTheThreadThatAskedForIt(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep(1) on this machine")
	}
	plain := startOnThrowawayThread(t, func(cmd *exec.Cmd) error {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd.Start()
	})
	kept := startOnThrowawayThread(t, func(cmd *exec.Cmd) error { return Start(cmd, syscall.SIGKILL) })
	// The control case: the thread's end kills the plain child.
	deadline := time.Now().Add(10 * time.Second)
	for alive(plain.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("the child of an ended thread still runs: the control case does not show the hazard")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if !alive(kept.Process.Pid) {
		t.Fatal("a child started through Start ended with the thread that asked for it")
	}
	if kept.SysProcAttr.Pdeathsig != syscall.SIGKILL {
		t.Errorf("Pdeathsig %v", kept.SysProcAttr.Pdeathsig)
	}
}
