package main

import (
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

func request(t *testing.T, method, u, token, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// envd's log has its lifecycle, /init, each process's start and exit, and the
// output lines of processes; never the access token, an environment value or
// a file's contents.
func TestLogLinesAndNoSecrets(t *testing.T) {
	const (
		token      = "tok-4f1c9e0b7d2a"
		initSecret = "init-env-7c1d99ab"
		reqSecret  = "req-env-0e8f5d21"
		fileSecret = "file-body-b3a94c60"
	)
	in := startEnvd(t, nil, "--log-process-output")
	if code, body := request(t, http.MethodPost, in.url+"/init", "", "application/json",
		`{"accessToken":"`+token+`","envVars":{"INIT_SECRET":"`+initSecret+`"},"defaultWorkdir":"/tmp"}`); code != http.StatusNoContent {
		t.Fatalf("init: %d %s", code, body)
	}
	if code, _ := request(t, http.MethodPost, in.url+"/init", "wrong-"+token, "application/json", `{"accessToken":"x"}`); code != http.StatusUnauthorized {
		t.Fatalf("init with a wrong token: %d, want 401", code)
	}

	path := filepath.Join(t.TempDir(), "secret.txt")
	files := in.url + "/files?path=" + url.QueryEscape(path)
	if code, body := request(t, http.MethodPost, files, token, "application/octet-stream", fileSecret); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, body)
	}
	if code, body := request(t, http.MethodGet, files, token, "", ""); code != http.StatusOK || body != fileSecret {
		t.Fatalf("download: %d %q", code, body)
	}

	req := bash(`[ -n "$INIT_SECRET" ] && [ -n "$REQ_SECRET" ] && echo envs-ok; echo oops >&2; ` +
		`head -c 5000 /dev/zero | tr '\0' a; echo; printf 'crlf\r\nno newline'; exit 3`)
	req.Process.Envs = map[string]string{"REQ_SECRET": reqSecret}
	r := in.run(t.Context(), req, map[string]string{"X-Access-Token": token})
	if r.err != nil || r.end.GetExitCode() != 3 || !strings.HasPrefix(r.stdout, "envs-ok\n") {
		t.Fatalf("run: stdout %q end %v err %v", r.stdout, r.end, r.err)
	}
	if st := in.stop(t); st.ExitCode() != 0 {
		t.Fatalf("envd exit %v", st)
	}

	text := in.logText()
	for _, secret := range []string{token, initSecret, reqSecret, fileSecret} {
		if strings.Contains(text, secret) {
			t.Errorf("the log holds %q:\n%s", secret, text)
		}
	}
	var seen []string
	var stdout, stderr []logLine
	for _, l := range parseLog(t, text) {
		switch l.Source {
		case "stdout":
			stdout = append(stdout, l)
		case "stderr":
			stderr = append(stderr, l)
		default:
			seen = append(seen, l.Line)
			switch l.Line {
			case "process started":
				if l.PID != r.pid || l.Cmd != "/bin/bash" {
					t.Errorf("start line %+v, want pid %d cmd /bin/bash", l, r.pid)
				}
			case "process exited":
				if l.PID != r.pid || l.ExitCode == nil || *l.ExitCode != 3 || l.Status != "exit status 3" {
					t.Errorf("exit line %+v, want pid %d exit 3", l, r.pid)
				}
			}
		}
	}
	want := []string{"envd starting", "envd listening", "init", "init refused: missing or wrong access token",
		"process started", "process exited", "envd shutting down", "envd stopped"}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Errorf("envd lines %q, want %q", seen, want)
	}
	if !strings.Contains(text, `"access_token":"set","env_vars":1,"default_workdir":"/tmp"`) {
		t.Errorf("no init line with what it set:\n%s", text)
	}

	wantOut := []struct {
		line      string
		truncated bool
	}{{"envs-ok", false}, {strings.Repeat("a", 4096), true}, {"crlf", false}, {"no newline", false}}
	if len(stdout) != len(wantOut) {
		t.Fatalf("stdout lines %+v, want %d", stdout, len(wantOut))
	}
	for i, w := range wantOut {
		if stdout[i].Line != w.line || stdout[i].Truncated != w.truncated || stdout[i].PID != r.pid {
			t.Errorf("stdout line %d = %+v, want %q truncated %v pid %d", i, stdout[i], w.line, w.truncated, r.pid)
		}
	}
	if len(stderr) != 1 || stderr[0].Line != "oops" || stderr[0].PID != r.pid {
		t.Errorf("stderr lines %+v, want oops", stderr)
	}
}

// The output lines stop at --log-output-limit, with one line saying so;
// envd's own lines go on.
func TestLogOutputLimit(t *testing.T) {
	in := startEnvd(t, nil, "--log-process-output", "--log-output-limit", "4KiB")
	for range 2 {
		if r := in.run(t.Context(), bash(`seq 1 1000`), nil); r.err != nil || r.end == nil {
			t.Fatalf("run: %v", r.err)
		}
	}
	in.stop(t)
	var out, stopped, exits, bytes int
	for _, l := range parseLog(t, in.logText()) {
		switch {
		case l.Source == "stdout":
			out++
		case strings.HasPrefix(l.Line, "process output logging stopped"):
			stopped++
		case l.Line == "process exited":
			exits++
		}
	}
	for _, line := range strings.SplitAfter(in.logText(), "\n") {
		if strings.Contains(line, `"source":"stdout"`) {
			bytes += len(line)
		}
	}
	if out == 0 || bytes > 4<<10 || stopped != 1 || exits != 2 {
		t.Fatalf("%d output lines (%d bytes), %d stop lines, %d exits; want some within 4 KiB, one stop line, 2 exits", out, bytes, stopped, exits)
	}
}

// --log-limit bounds the whole log: one line says logging stopped, and
// nothing follows.
func TestLogLimit(t *testing.T) {
	in := startEnvd(t, nil, "--log-limit", "2KiB")
	for range 10 {
		if r := in.run(t.Context(), bash(`true`), nil); r.err != nil {
			t.Fatalf("run: %v", r.err)
		}
	}
	in.stop(t)
	text := in.logText()
	lines := parseLog(t, text)
	if last := lines[len(lines)-1]; !strings.HasPrefix(last.Line, "logging stopped") || len(text) > 2<<10+256 {
		t.Fatalf("log of %d bytes ending with %+v, want at most 2 KiB and a stop line", len(text), last)
	}
}
