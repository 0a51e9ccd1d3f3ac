package reap

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// start runs script under bash through r.Spawn and returns the command and
// its release.
func start(t *testing.T, r *Reaper, script string) (*exec.Cmd, func()) {
	t.Helper()
	cmd := exec.Command("/bin/bash", "-c", script)
	release, err := r.Spawn(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return cmd, release
}

func zombieChildren(t *testing.T) int {
	t.Helper()
	n := 0
	for _, pid := range children() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] == "Z" {
			n++
		}
	}
	return n
}

// The processes started through Spawn keep their exit statuses while the
// orphans they leave are reaped.
func TestSpawnKeepsStatusesOrphansReaped(t *testing.T) {
	r, err := Start()
	if err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	defer r.Close()
	if !r.Subreaper() {
		t.Fatal("a test is not PID 1: want a subreaper")
	}
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// The sleep outlives its shell (0.3–0.5 s against the shell's
			// exit at once), so it is an orphan; a sleep that ended first
			// would be reaped by the shell, not by r.
			cmd, release := start(t, r, "sleep 0.$((3 + RANDOM % 3)) & exit "+strconv.Itoa(i%4))
			err := cmd.Wait()
			release()
			if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != i%4 {
				t.Errorf("#%d: %v, want exit %d", i, err, i%4)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for r.Reaped() < n || zombieChildren(t) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("reaped %d orphans, %d zombies left; want %d reaped, none left", r.Reaped(), zombieChildren(t), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close kills the orphans a subreaper adopted and that still run.
func TestCloseKillsAdoptedOrphans(t *testing.T) {
	r, err := Start()
	if err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	cmd := exec.Command("/bin/bash", "-c", "sleep 100 >/dev/null 2>&1 & echo $!")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	release, err := r.Spawn(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(out)
	_ = cmd.Wait()
	release()
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("printed %q: %v", b, err)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("orphan %d not running before Close: %v", pid, err)
	}
	r.Close()
	if err := syscall.Kill(pid, 0); err == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("orphan %d survived Close", pid)
	}
}

func TestNilReaper(t *testing.T) {
	var r *Reaper
	cmd := exec.Command("/bin/true")
	release, err := r.Spawn(func() (int, error) { return 0, cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	release()
	r.Close()
	if r.Reaped() != 0 || r.Subreaper() {
		t.Fatal("a nil reaper reaps")
	}
}

// BenchmarkStart is what being init costs envd at startup: becoming a
// subreaper (PID 1 skips that), the SIGCHLD handler and the reaper goroutine.
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		r, err := Start()
		if err != nil {
			b.Skip(err)
		}
		b.StopTimer()
		r.Close()
		b.StartTimer()
	}
}
