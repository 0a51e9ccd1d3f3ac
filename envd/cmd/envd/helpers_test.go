package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/hosttest"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
)

// envdBin is the envd binary the tests run, built once by TestMain.
var envdBin string

// envdBinEnv hands the binary TestMain built to the tests' run in their
// mount namespace.
const envdBinEnv = "ENVD_TEST_BIN"

// TestMain builds envd, then runs the tests where root's and the users'
// homes are empty tmpfs mounts (hosttest): they run envd's routes as root.
// It builds first, outside, where go build finds its caches (in root's
// home), and hands the binary on in $ENVD_TEST_BIN.
func TestMain(m *testing.M) {
	if envdBin = os.Getenv(envdBinEnv); envdBin != "" {
		hosttest.Main(m)
	}
	dir, err := os.MkdirTemp("", "envd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Executable by every uid: tests also run envd as an unprivileged user.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	envdBin = filepath.Join(dir, "envd")
	build := exec.Command("go", "build", "-o", envdBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	code := 1
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build envd:", err)
	} else {
		os.Setenv(envdBinEnv, envdBin)
		code = hosttest.Run(m)
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func TestHomesAreHidden(t *testing.T) { hosttest.AssertHidden(t) }

// instance is one envd process and what it logged.
type instance struct {
	cmd    *exec.Cmd
	pid    int // in the host's pid namespace
	url    string
	client processconnect.ProcessClient

	mu     sync.Mutex
	log    []byte
	exited chan struct{} // closed when stdout hit EOF and the process was waited for
	state  *os.ProcessState
}

// newPIDNamespace makes envd PID 1 of a new pid namespace, inside a user
// namespace where it is root, as sandboxd runs it.
func newPIDNamespace() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  syscall.SIGKILL,
	}
}

// startEnvd runs the envd binary with args on a free loopback port, waits
// for its "listening" line, and kills it (and so its pid namespace) at the
// end of the test. attr nil runs it as a plain child.
func startEnvd(t *testing.T, attr *syscall.SysProcAttr, args ...string) *instance {
	t.Helper()
	cmd := exec.Command(envdBin, append([]string{"--listen-address", "127.0.0.1", "--port", "0"}, args...)...)
	if attr == nil {
		attr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		if attr.Cloneflags != 0 && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC)) {
			t.Skipf("cannot create a user and pid namespace here: %v", err)
		}
		t.Fatal(err)
	}
	in := &instance{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-in.exited:
		default:
			_ = cmd.Process.Kill() // PID 1: the whole namespace goes with it
			<-in.exited
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			in.mu.Lock()
			in.log = append(in.log, sc.Bytes()...)
			in.log = append(in.log, '\n')
			in.mu.Unlock()
			var l struct{ Line, Address string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Line == "envd listening" {
				addr <- l.Address
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		in.state = cmd.ProcessState
		close(in.exited)
	}()
	select {
	case a := <-addr:
		in.url = "http://" + a
	case <-in.exited:
		t.Fatalf("envd exited before listening: %v\n%s", in.state, in.logText())
	case <-time.After(10 * time.Second):
		t.Fatalf("envd did not log that it listens\n%s", in.logText())
	}
	in.client = processconnect.NewProcessClient(http.DefaultClient, in.url, connect.WithProtoJSON())
	return in
}

func (in *instance) logText() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return string(in.log)
}

// stop sends SIGTERM and returns envd's exit status.
func (in *instance) stop(t *testing.T) *os.ProcessState {
	t.Helper()
	if err := in.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-in.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("envd did not stop on SIGTERM\n%s", in.logText())
	}
	return in.state
}

// result is what a Start stream delivered.
type result struct {
	pid    uint32
	stdout string
	stderr string
	end    *pb.ProcessEvent_EndEvent
	err    error
}

func (in *instance) run(ctx context.Context, req *pb.StartRequest, headers map[string]string) result {
	creq := connect.NewRequest(req)
	for k, v := range headers {
		creq.Header().Set(k, v)
	}
	stream, err := in.client.Start(ctx, creq)
	if err != nil {
		return result{err: err}
	}
	defer stream.Close()
	var r result
	for stream.Receive() {
		switch e := stream.Msg().GetEvent().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
		case *pb.ProcessEvent_Data:
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
		case *pb.ProcessEvent_End:
			r.end = e.End
		}
	}
	r.err = stream.Err()
	return r
}

// bash runs script in a non-login shell (a login shell reads the host's
// profile, and a kill in the middle can leave its locks behind).
func bash(script string) *pb.StartRequest {
	no := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}, Stdin: &no}
}

// hostProc is a process as the host's /proc shows it.
type hostProc struct {
	pid   int
	state byte
	comm  string
}

// children lists the processes whose parent is ppid, from the host's /proc.
func children(ppid int) []hostProc {
	ents, _ := os.ReadDir("/proc")
	var out []hostProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 {
			continue
		}
		if p, err := strconv.Atoi(f[1]); err == nil && p == ppid {
			out = append(out, hostProc{pid: pid, state: f[0][0], comm: s[open+1 : end]})
		}
	}
	return out
}

func zombies(ppid int) []hostProc {
	var out []hostProc
	for _, p := range children(ppid) {
		if p.state == 'Z' {
			out = append(out, p)
		}
	}
	return out
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logLine is one line of envd's log, with the fields the tests look at.
type logLine struct {
	Time      string `json:"time"`
	Source    string `json:"source"`
	Line      string `json:"line"`
	Level     string `json:"level"`
	PID       uint32 `json:"pid"`
	Cmd       string `json:"cmd"`
	ExitCode  *int32 `json:"exit_code"`
	Status    string `json:"status"`
	Truncated bool   `json:"truncated"`
	Reaped    *int   `json:"orphans_reaped"`
}

// parseLog checks that every line is a JSON object with time, source and
// line, and returns them.
func parseLog(t *testing.T, text string) []logLine {
	t.Helper()
	var out []logLine
	for _, raw := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		var l logLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("log line %q is not JSON: %v", raw, err)
		}
		if _, err := time.Parse(time.RFC3339Nano, l.Time); err != nil || !strings.HasSuffix(l.Time, "Z") {
			t.Fatalf("log line %q: time %q is not RFC 3339 in UTC", raw, l.Time)
		}
		switch l.Source {
		case "envd", "stdout", "stderr":
		default:
			t.Fatalf("log line %q: source %q", raw, l.Source)
		}
		if !strings.Contains(raw, `"line":`) {
			t.Fatalf("log line %q has no line", raw)
		}
		out = append(out, l)
	}
	return out
}
