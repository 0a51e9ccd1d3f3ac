package system

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a Progress the supervisors and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond; the bound only turns a hang into a failure.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A server that dies is started again after a backoff that grows, with a
// line that says which, why and when; once Stop has begun, nothing is
// restarted.
func TestSupervisorRestartsWhatDies(t *testing.T) {
	sleep, err := exec.LookPath("sleep") // a server that runs until killed
	if err != nil {
		t.Skip("no sleep(1) on this machine")
	}
	progress := &syncBuffer{}
	s := &System{cfg: Config{State: t.TempDir(), Progress: progress}}
	if err := os.MkdirAll(s.LogDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.start("sleeper", sleep, "600"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stopSupervising(); s.stopProcesses() })
	s.supervise()

	for i, backoff := range []string{"1s", "2s"} {
		pid := s.PID("sleeper")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the sleeper restarted", 10*time.Second, func() bool { return s.Restarts("sleeper") == i+1 })
		if s.PID("sleeper") == pid {
			t.Fatalf("restart %d kept pid %d", i+1, pid)
		}
		out := progress.String()
		if !strings.Contains(out, "sleeper exited (signal: killed) after ") || !strings.Contains(out, "restarting it in "+backoff) ||
			!strings.Contains(out, "restarted sleeper (pid ") {
			t.Fatalf("progress after restart %d says:\n%s", i+1, out)
		}
	}
	log, err := os.ReadFile(filepath.Join(s.LogDir(), "sleeper.log"))
	if err != nil || strings.Count(string(log), "--- skiff-up: sleeper exited") != 2 {
		t.Errorf("the log does not mark both restarts (%v):\n%s", err, log)
	}

	// Stop's own SIGTERM is no crash.
	pid := s.PID("sleeper")
	s.stopSupervising()
	s.stopProcesses()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("pid %d still runs after stop", pid)
	}
	if n := strings.Count(progress.String(), "restarted sleeper"); n != 2 {
		t.Errorf("%d restarts, want 2 (none after stop):\n%s", n, progress)
	}
}

// supervisedHelper, when set, makes TestSupervisedHelper the process whose
// death TestServersEndWithTheirSupervisor watches.
const supervisedHelper = "SKIFF_TEST_SUPERVISED_HELPER"

// TestSupervisedHelper starts a server, prints its PID and waits to be
// killed. It runs only as TestServersEndWithTheirSupervisor's child.
func TestSupervisedHelper(t *testing.T) {
	state := os.Getenv(supervisedHelper)
	if state == "" {
		t.Skip("a helper of TestServersEndWithTheirSupervisor")
	}
	s := &System{cfg: Config{State: state, Progress: io.Discard}}
	if err := os.MkdirAll(s.LogDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.start("sleeper", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("pid %d\n", s.PID("sleeper"))
	time.Sleep(time.Minute) // killed before
}

// A supervisor that dies without stopping its servers (SIGKILL, a test
// binary's timeout) takes them with it: each gets SIGTERM.
func TestServersEndWithTheirSupervisor(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep(1) on this machine")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSupervisedHelper$", "-test.v")
	cmd.Env = append(os.Environ(), supervisedHelper+"="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := 0
	sc := bufio.NewScanner(out)
	for pid == 0 && sc.Scan() {
		_, _ = fmt.Sscanf(sc.Text(), "pid %d", &pid)
	}
	if pid == 0 {
		t.Fatalf("the helper printed no pid (%v)", sc.Err())
	}
	// Kill the sleeper if this test fails, so that it leaves nothing.
	defer func() {
		if t.Failed() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Gone, or a zombie that this machine's init has not reaped yet.
	waitFor(t, "the server ended with its supervisor", 10*time.Second, func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		_, after, _ := strings.Cut(string(stat), ") ")
		return strings.HasPrefix(after, "Z")
	})
}
