package server_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/server"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
)

// envd is a running envd behind httptest, and a process client speaking
// Connect JSON over HTTP/1.1, as the e2b SDKs do.
type envd struct {
	srv    *server.Server
	url    string
	client processconnect.ProcessClient
}

func startEnvd(t *testing.T) *envd {
	t.Helper()
	srv := server.New(server.NewOptions())
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		srv.Close()
	})
	return &envd{srv: srv, url: ts.URL, client: processconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON())}
}

// result is what a Start stream delivered.
type result struct {
	pid            uint32
	first          string // the first event's kind
	stdout, stderr string
	pty            string
	keepalives     int
	end            *pb.ProcessEvent_EndEvent
	err            error
}

func collect(stream interface {
	Receive() bool
	Err() error
}, event func() *pb.ProcessEvent) result {
	var r result
	for stream.Receive() {
		ev := event()
		switch e := ev.GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			if r.first == "" {
				r.first = "start"
			}
			r.pid = e.Start.GetPid()
		case *pb.ProcessEvent_Data:
			if r.first == "" {
				r.first = "data"
			}
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
			r.pty += string(e.Data.GetPty())
		case *pb.ProcessEvent_Keepalive:
			r.keepalives++
		case *pb.ProcessEvent_End:
			if r.first == "" {
				r.first = "end"
			}
			r.end = e.End
		}
	}
	r.err = stream.Err()
	return r
}

func (e *envd) run(ctx context.Context, t *testing.T, req *pb.StartRequest, headers map[string]string) result {
	t.Helper()
	creq := connect.NewRequest(req)
	for k, v := range headers {
		creq.Header().Set(k, v)
	}
	stream, err := e.client.Start(ctx, creq)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer stream.Close()
	return collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
}

// bash runs script in a non-login shell: a login shell would read the host's
// profile (slow, and a kill in the middle can leave its locks behind).
func bash(script string) *pb.StartRequest {
	no := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}, Stdin: &no}
}

func basic(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

func TestStartExitCodesAndOutput(t *testing.T) {
	e := startEnvd(t)
	for _, tc := range []struct {
		name         string
		script       string
		stdout       string
		stderr       string
		code         int32
		status       string
		wantEndError bool
	}{
		{"success", "echo hi", "hi\n", "", 0, "exit status 0", false},
		{"failure with stderr", "echo out; echo oops >&2; exit 3", "out\n", "oops\n", 3, "exit status 3", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(t.Context(), t, bash(tc.script), nil)
			if r.err != nil {
				t.Fatalf("stream: %v", r.err)
			}
			if r.first != "start" || r.pid == 0 {
				t.Fatalf("first event %q pid %d, want start with a pid", r.first, r.pid)
			}
			if r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Fatalf("stdout %q stderr %q, want %q %q", r.stdout, r.stderr, tc.stdout, tc.stderr)
			}
			if r.end == nil || r.end.GetExitCode() != tc.code || !r.end.GetExited() || r.end.GetStatus() != tc.status || (r.end.Error != nil) != tc.wantEndError {
				t.Fatalf("end = %+v, want code %d status %q error %v", r.end, tc.code, tc.status, tc.wantEndError)
			}
		})
	}
}

// The environment is built: PATH, HOME, USER, LOGNAME, the sandbox defaults,
// then the request's envs; nothing else of envd's own environment leaks.
func TestStartEnvironment(t *testing.T) {
	t.Setenv("ENVD_OWN_SECRET", "leak")
	e := startEnvd(t)
	req := bash(`echo "$HOME|$USER|$LOGNAME|$E2B_SANDBOX|$FOO|${ENVD_OWN_SECRET:-unset}|$PWD"`)
	req.Process.Envs = map[string]string{"FOO": "bar", "E2B_SANDBOX": "overridden"}
	cwd := t.TempDir()
	req.Process.Cwd = &cwd
	r := e.run(t.Context(), t, req, nil)
	want := "/root|root|root|overridden|bar|unset|" + cwd + "\n"
	if r.stdout != want {
		t.Fatalf("stdout = %q, want %q", r.stdout, want)
	}
}

func TestStartErrors(t *testing.T) {
	e := startEnvd(t)
	missing := "/nonexistent"
	for _, tc := range []struct {
		name    string
		req     *pb.StartRequest
		auth    string
		code    connect.Code
		message string
	}{
		{"missing cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Cwd: &missing}}, "", connect.CodeInvalidArgument, "cwd '/nonexistent' does not exist"},
		{"empty cmd", &pb.StartRequest{Process: &pb.ProcessConfig{}}, "", connect.CodeInvalidArgument, "cmd is empty"},
		{"missing binary", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/binary"}}, "", connect.CodeInvalidArgument, "no such file"},
		{"command on no PATH", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "no-such-command-here"}}, "", connect.CodeInvalidArgument, "executable file not found"},
		{"unknown user", bash("true"), basic("no-such-user"), connect.CodeUnauthenticated, "invalid username: 'no-such-user'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := map[string]string{}
			if tc.auth != "" {
				headers["Authorization"] = tc.auth
			}
			r := e.run(t.Context(), t, tc.req, headers)
			if r.first != "" {
				t.Fatalf("got a %s event, want no event before the error", r.first)
			}
			if connect.CodeOf(r.err) != tc.code || !strings.Contains(r.err.Error(), tc.message) {
				t.Fatalf("err = %v, want %s containing %q", r.err, tc.code, tc.message)
			}
		})
	}
}

// A command with a slash is a path, relative to the working directory, as
// to a shell; never looked up on the PATH.
func TestStartRelativePath(t *testing.T) {
	e := startEnvd(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ls"), []byte("#!/bin/sh\necho mine\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := e.run(t.Context(), t, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "./ls", Cwd: &dir}}, nil)
	if r.err != nil || r.stdout != "mine\n" {
		t.Fatalf("./ls in %s: stdout %q, err %v; want the working directory's ls", dir, r.stdout, r.err)
	}
	// A relative directory of the process's PATH is its working directory
	// too, not envd's.
	r = e.run(t.Context(), t, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "ls", Cwd: &dir, Envs: map[string]string{"PATH": "."}}}, nil)
	if r.err != nil || r.stdout != "mine\n" {
		t.Fatalf("ls with PATH=. in %s: stdout %q, err %v; want the working directory's ls", dir, r.stdout, r.err)
	}
}

func TestStartAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running as another user needs root")
	}
	e := startEnvd(t)
	r := e.run(t.Context(), t, bash("id -un; echo $HOME"), map[string]string{"Authorization": basic("nobody")})
	if r.err != nil || !strings.HasPrefix(r.stdout, "nobody\n") {
		t.Fatalf("stdout %q err %v, want nobody", r.stdout, r.err)
	}
}

// Connect-Timeout-Ms is the process's lifetime: the stream ends with
// deadline_exceeded and the process is killed.
func TestStartTimeoutKills(t *testing.T) {
	e := startEnvd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	tag := "sleeper"
	req := bash("sleep 30")
	req.Tag = &tag
	r := e.run(ctx, t, req, nil)
	if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
		t.Fatalf("err = %v, want deadline_exceeded", r.err)
	}
	waitFor(t, func() bool { return len(list(t, e)) == 0 }, "the timed-out process to be killed")
}

func list(t *testing.T, e *envd) []*pb.ProcessInfo {
	t.Helper()
	resp, err := e.client.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return resp.Msg.GetProcesses()
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A client that goes away leaves its process running: List shows it, a
// Connect by tag re-attaches, stdin still works, and closing stdin ends it.
func TestBackgroundReconnectStdin(t *testing.T) {
	e := startEnvd(t)
	tag := "cat-1"
	yes := true
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Tag: &tag, Stdin: &yes}
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := e.client.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("first event = %v, %v; want start", stream.Msg(), stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	cancel()
	_ = stream.Close()

	procs := list(t, e)
	if len(procs) != 1 || procs[0].GetPid() != pid || procs[0].GetTag() != tag || procs[0].GetConfig().GetCmd() != "cat" {
		t.Fatalf("List = %v, want the cat process", procs)
	}
	conn, err := e.client.Connect(t.Context(), connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("Connect first event = %v, want start %d", conn.Msg(), pid)
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.client.SendInput(t.Context(), connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("ping\n")}}})); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	if !conn.Receive() || string(conn.Msg().GetEvent().GetData().GetStdout()) != "ping\n" {
		t.Fatalf("after input: %v, %v; want stdout ping", conn.Msg(), conn.Err())
	}
	if _, err := e.client.CloseStdin(t.Context(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	r := collect(conn, func() *pb.ProcessEvent { return conn.Msg().GetEvent() })
	if r.err != nil || r.end == nil || r.end.GetExitCode() != 0 {
		t.Fatalf("after CloseStdin: end %v err %v, want a clean exit", r.end, r.err)
	}

	// A late Connect still gets the end.
	late, err := e.client.Connect(t.Context(), connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	lr := collect(late, func() *pb.ProcessEvent { return late.Msg().GetEvent() })
	if lr.first != "start" || lr.end == nil {
		t.Fatalf("late Connect = %+v, want start then end", lr)
	}
	// Input to an ended process is an error.
	_, err = e.client.SendInput(t.Context(), connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("SendInput after exit = %v, want not_found", err)
	}
}

func TestSignalAndNotFound(t *testing.T) {
	e := startEnvd(t)
	ctx := t.Context()
	stream, err := e.client.Start(ctx, connect.NewRequest(bash("sleep 30")))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}

	// stdin:false: no stdin to write to or close.
	_, err = e.client.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("SendInput without stdin = %v, want failed_precondition", err)
	}
	if _, err := e.client.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
	r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.err != nil || r.end == nil || r.end.GetExitCode() != -1 || r.end.GetExited() || r.end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %+v err %v, want -1, not exited, signal: killed", r.end, r.err)
	}

	unknown := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}
	_, err = e.client.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: unknown, Signal: pb.Signal_SIGNAL_SIGTERM}))
	if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "process with pid 999999 not found") {
		t.Fatalf("SendSignal(unknown) = %v, want not_found", err)
	}
	_, err = e.client.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("SendSignal(unspecified) = %v, want invalid_argument", err)
	}
	_, err = e.client.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: &pb.ProcessSelector{}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("CloseStdin(empty selector) = %v, want invalid_argument", err)
	}
}

// CloseStdin of a process whose stdin is not open (stdin:false, the SDK's
// default for commands.run, or closed already) succeeds and does nothing,
// as with e2b's envd: the SDK's closeStdin must not fail on such a command.
func TestCloseStdinWithoutStdin(t *testing.T) {
	e := startEnvd(t)
	ctx := t.Context()
	stream, err := e.client.Start(ctx, connect.NewRequest(bash("sleep 30")))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
	for i := range 2 {
		if _, err := e.client.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatalf("CloseStdin #%d without stdin: %v", i+1, err)
		}
	}
	if _, err := e.client.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
	if r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }); r.end == nil || r.end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %+v err %v, want killed: CloseStdin must leave the process running", r.end, r.err)
	}
}

func TestKeepalive(t *testing.T) {
	e := startEnvd(t)
	r := e.run(t.Context(), t, bash("sleep 1.3; echo done"), map[string]string{"Keepalive-Ping-Interval": "0.4"})
	if r.err != nil || r.stdout != "done\n" || r.keepalives < 2 {
		t.Fatalf("keepalives %d stdout %q err %v, want at least 2 keepalives then done", r.keepalives, r.stdout, r.err)
	}
}

func TestPTY(t *testing.T) {
	e := startEnvd(t)
	ctx := t.Context()
	req := &pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	}
	stream, err := e.client.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.client.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatalf("Update: %v", err)
	}
	// Before the input, whose exit may end the shell before a later call
	// (not_found, as seen under load).
	_, err = e.client.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("CloseStdin on a pty = %v, want failed_precondition", err)
	}
	input := "echo $((6*7)); stty size; exit 7\n"
	if _, err := e.client.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(input)}}})); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.err != nil || !strings.Contains(r.pty, "42") || !strings.Contains(r.pty, "30 100") || r.end.GetExitCode() != 7 {
		t.Fatalf("pty output %q end %v err %v, want 42, '30 100' and exit 7", r.pty, r.end, r.err)
	}
}

// Once /init sets a token, every route but the exempt ones needs it.
func TestAccessToken(t *testing.T) {
	e := startEnvd(t)
	post := func(path, body, token string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post("/init", `{"accessToken":"s3cret","envVars":{"A":"1"}}`, ""); got != http.StatusNoContent {
		t.Fatalf("init = %d, want 204", got)
	}
	_, err := e.client.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("List without token = %v, want unauthenticated (401)", err)
	}
	req := connect.NewRequest(&pb.ListRequest{})
	req.Header().Set("X-Access-Token", "s3cret")
	if _, err := e.client.List(t.Context(), req); err != nil {
		t.Fatalf("List with token: %v", err)
	}
	resp, err := http.Get(e.url + "/health")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health without token = %v %v, want 204", resp, err)
	}
	resp.Body.Close()
	if got := post("/init", `{"accessToken":"other"}`, ""); got != http.StatusUnauthorized {
		t.Fatalf("re-init without the token = %d, want 401", got)
	}
	if got := post("/init", `{"accessToken":"other"}`, "s3cret"); got != http.StatusNoContent {
		t.Fatalf("re-init with the token = %d, want 204", got)
	}
	if got := post("/init", `{"defaultUser":"no-such-user"}`, "other"); got != http.StatusBadRequest {
		t.Fatalf("init with an unknown user = %d, want 400", got)
	}
	if got := post("/init", `{"timestamp":"yesterday"}`, "other"); got != http.StatusBadRequest {
		t.Fatalf("init with a bad timestamp = %d, want 400", got)
	}
	if got := post("/init", `{"timestamp":"2026-11-29T18:25:03.998508642Z","defaultWorkdir":"/tmp"}`, "other"); got != http.StatusNoContent {
		t.Fatalf("init with a timestamp = %d, want 204", got)
	}
	if got := post("/init", `{bad json`, "other"); got != http.StatusBadRequest {
		t.Fatalf("init with bad JSON = %d, want 400", got)
	}
}

// StreamInput (client streaming, which the SDKs do not use) writes to the
// selected process.
func TestStreamInput(t *testing.T) {
	e := startEnvd(t)
	yes := true
	stream, err := e.client.Start(t.Context(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "head", Args: []string{"-n", "2"}}, Stdin: &yes}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
	in := e.client.StreamInput(t.Context())
	data := func(s string) *pb.StreamInputRequest {
		return &pb.StreamInputRequest{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(s)}}}}}
	}
	for _, msg := range []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
		data("one\n"),
		{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		data("two\n"),
	} {
		if err := in.Send(msg); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("StreamInput: %v", err)
	}
	r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.err != nil || r.stdout != "one\ntwo\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("stdout %q end %v err %v, want one two and exit 0", r.stdout, r.end, r.err)
	}

	// Data before a start event is bad input.
	bad := e.client.StreamInput(t.Context())
	_ = bad.Send(data("x"))
	if _, err := bad.CloseAndReceive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("data before start = %v, want invalid_argument", err)
	}
}

// A process envd starts ranks above envd for the OOM killer from its first
// instruction, so a storm of them past the sandbox's memory limit costs
// them and not envd (the sandbox's init); envd's own score is as it was.
func TestStartedProcessesRankAboveEnvdForTheOOMKiller(t *testing.T) {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Skip("no oom_score_adj here")
	}
	e := startEnvd(t)
	r := e.run(t.Context(), t, bash("cat /proc/self/oom_score_adj"), nil)
	if r.err != nil || strings.TrimSpace(r.stdout) != "1000" {
		t.Errorf("a started process has oom_score_adj %q (%v), want 1000", r.stdout, r.err)
	}
	if after, _ := os.ReadFile("/proc/self/oom_score_adj"); string(after) != string(own) {
		t.Errorf("envd's own oom_score_adj went from %q to %q", own, after)
	}
}

// TestBackgroundChildHoldsOutput: as e2b's envd, a process whose background
// child holds its output ends when the output does, with the child's output
// in it; and a child that outlives its process's end (killed at the
// stream's timeout, having left its group) can still write: its pipe is
// read to the end, never closed under it.
func TestBackgroundChildHoldsOutput(t *testing.T) {
	e := startEnvd(t)
	r := e.run(t.Context(), t, bash("echo a; (sleep 0.5; echo b) &"), nil)
	if r.err != nil || r.stdout != "a\nb\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("stdout %q, end %v, err %v; want a and the background child's b, exit 0", r.stdout, r.end, r.err)
	}

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	// setsid: the child leaves the group that the timeout's SIGKILL ends.
	r = e.run(ctx, t, bash("setsid bash -c 'sleep 2; echo late; touch "+dir+"/wrote' & echo started"), nil)
	if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded || r.stdout != "started\n" {
		t.Fatalf("stdout %q, err %v; want started, then deadline_exceeded", r.stdout, r.err)
	}
	waitFor(t, func() bool { _, err := os.Stat(filepath.Join(dir, "wrote")); return err == nil },
		"the detached child to write after its process's end (EPIPE would have killed it before its touch)")
}
