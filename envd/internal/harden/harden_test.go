package harden

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// helperEnv selects what the test binary does when a test runs it as a
// child (see TestHelperProcess); probePIDsEnv lists the pids a probe tries.
const (
	helperEnv    = "HARDEN_TEST_HELPER"
	probePIDsEnv = "HARDEN_TEST_PIDS"
)

// TestHelperProcess is the body of the test binary run as a child; as a
// plain test it does nothing. Modes:
//   - report: print the dumpable flag;
//   - envd, envd-plain: like envd, call NonDumpable (envd-plain does not),
//     start `sleep`, print "<own pid> <sleep's pid>", and wait for stdin to
//     close;
//   - probe: for each pid of probePIDsEnv print whether this process may
//     open its /proc mem (ptrace attach mode) and read its fd links (read
//     mode).
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		return
	case "report":
		v, err := Dumpable()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println(v)
	case "envd", "envd-plain":
		if os.Getenv(helperEnv) == "envd" {
			if err := NonDumpable(); err != nil {
				t.Fatal(err)
			}
		}
		sleep := exec.Command("sleep", "60")
		if err := sleep.Start(); err != nil {
			t.Fatal(err)
		}
		fmt.Println(os.Getpid(), sleep.Process.Pid)
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
	case "probe":
		for pid := range strings.SplitSeq(os.Getenv(probePIDsEnv), ",") {
			_, err := os.Readlink("/proc/" + pid + "/fd/0")
			fmt.Printf("%s mem=%s fd=%s\n", pid, result(openErr("/proc/"+pid+"/mem")), result(err))
		}
	}
	os.Exit(0)
}

func openErr(p string) error {
	f, err := os.Open(p)
	if err == nil {
		f.Close()
	}
	return err
}

// result names an access's outcome: ok, denied, or the error.
func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, fs.ErrPermission):
		return "denied"
	}
	return err.Error()
}

// helperCommand runs the test binary as a child in mode, as cred (nil: as
// the test itself).
func helperCommand(bin, mode string, cred *syscall.Credential, env ...string) *exec.Cmd {
	cmd := exec.Command(bin, "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	return cmd
}

func dumpable(t *testing.T) int {
	t.Helper()
	v, err := Dumpable()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestNonDumpable: NonDumpable clears the process's flag, and a process it
// starts is dumpable again.
func TestNonDumpable(t *testing.T) {
	if v := dumpable(t); v != 1 {
		t.Skipf("the test process starts with dumpable %d, not 1", v)
	}
	if err := NonDumpable(); err != nil {
		t.Fatal(err)
	}
	if v := dumpable(t); v != 0 {
		t.Fatalf("dumpable = %d after NonDumpable, want 0", v)
	}
	out, err := helperCommand(os.Args[0], "report", nil).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "1" {
		t.Errorf("a child reports dumpable %q, want 1 (execve resets it)", got)
	}
}

// unprivileged returns the credentials the ptrace test runs its children
// with, and a copy of the test binary they can execute. A user without
// CAP_SYS_PTRACE stands for the sandbox's root, which lacks it too: the
// kernel lets either reach a process of its own uid and capabilities, unless
// that process is not dumpable.
func unprivileged(t *testing.T) (*syscall.Credential, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, os.Args[0] // the test itself is unprivileged
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "harden.test")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return &syscall.Credential{Uid: 65534, Gid: 65534}, bin
}

// TestNonDumpableRefusesPtrace: a process of the same uid without
// CAP_SYS_PTRACE can no longer open /proc/<envd>/mem or read envd's fd
// links, and still can those of a process envd started.
func TestNonDumpableRefusesPtrace(t *testing.T) {
	cred, bin := unprivileged(t)
	for _, tc := range []struct {
		mode     string
		wantEnvd string
	}{
		{"envd", "mem=denied fd=denied"},
		{"envd-plain", "mem=ok fd=ok"}, // the probe itself is sound
	} {
		t.Run(tc.mode, func(t *testing.T) {
			envd := helperCommand(bin, tc.mode, cred)
			stdin, err := envd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := envd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := envd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				stdin.Close()
				_ = envd.Wait()
			})
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("read the helper's pids: %v", err)
			}
			var self, started int
			if _, err := fmt.Sscan(line, &self, &started); err != nil {
				t.Fatalf("pids %q: %v", line, err)
			}
			pids := strconv.Itoa(self) + "," + strconv.Itoa(started)
			out, err := helperCommand(bin, "probe", cred, probePIDsEnv+"="+pids).Output()
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%d %s\n%d mem=ok fd=ok\n", self, tc.wantEnvd, started)
			if string(out) != want {
				t.Errorf("probe:\n%s\nwant\n%s", out, want)
			}
		})
	}
}
