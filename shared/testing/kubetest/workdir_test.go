package kubetest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSweepOrphans(t *testing.T) {
	tmp := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	mk := func(name, owner string) string {
		dir := filepath.Join(tmp, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	deadDir := mk(workDirPrefix+"dead", strconv.Itoa(dead.Process.Pid))
	keep := []string{
		mk(workDirPrefix+"live", strconv.Itoa(os.Getppid())),
		mk(workDirPrefix+"self", strconv.Itoa(os.Getpid())),
		mk(workDirPrefix+"no-owner", ""),
		mk(workDirPrefix+"garbage", "not a pid"),
		mk("other-prefix", strconv.Itoa(dead.Process.Pid)),
	}
	sweepOrphans(tmp)
	if _, err := os.Stat(deadDir); !os.IsNotExist(err) {
		t.Errorf("%s of a dead owner: stat = %v, want removed", deadDir, err)
	}
	for _, dir := range keep {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: %v, want kept", dir, err)
		}
	}
}

// A test binary killed outright runs no cleanup: its etcd and kube-apiserver
// still die with it, and the next Start removes its work folder.
func TestKilledTestLeavesNothing(t *testing.T) {
	if os.Getenv("KUBETEST_HELPER") != "" {
		t.Skip("this is the helper process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperControlPlane$", "-test.v")
	cmd.Env = append(os.Environ(), "KUBETEST_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var work string
	for sc := bufio.NewScanner(out); sc.Scan(); {
		if w, ok := strings.CutPrefix(sc.Text(), "workdir="); ok {
			work = w
			break
		}
	}
	if work == "" {
		t.Fatal("the helper never reported a running control plane")
	}
	if len(processesUsing(t, work)) != 2 {
		t.Fatalf("processes using %s = %v, want etcd and kube-apiserver", work, processesUsing(t, work))
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	deadline := time.Now().Add(10 * time.Second)
	for len(processesUsing(t, work)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("10s after the test binary died, %v still run", processesUsing(t, work))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the control plane died %s after the test binary", time.Since(deadline.Add(-10*time.Second)).Round(time.Millisecond))
	if _, err := os.Stat(work); err != nil {
		t.Fatalf("work folder: %v, want it left behind by the killed binary", err)
	}
	sweepOrphans(filepath.Dir(work))
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Fatalf("work folder after a sweep: %v, want removed", err)
	}
}

// TestHelperControlPlane is the process TestKilledTestLeavesNothing kills.
func TestHelperControlPlane(t *testing.T) {
	if os.Getenv("KUBETEST_HELPER") == "" {
		t.Skip("runs only as TestKilledTestLeavesNothing's helper process")
	}
	env := Start(t)
	os.Stdout.WriteString("workdir=" + env.WorkDir + "\n")
	time.Sleep(time.Minute)
}

// processesUsing returns live (not zombie: their command line is empty)
// processes whose command line mentions a path inside dir, as "pid command".
func processesUsing(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var procs []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), dir+string(filepath.Separator)) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		procs = append(procs, e.Name()+" "+filepath.Base(args[0]))
	}
	return procs
}
