package sandboxtest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/vishvananda/netns"

	"github.com/skiff-dev/skiff/envd/proto/process"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
	"github.com/skiff-dev/skiff/wire"
)

// NetnsDialer returns a DialContext that opens connections from inside the
// network namespace at path.
func NetnsDialer(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			ns, err := netns.GetFromPath(path)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				ch <- result{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// Envd talks to one envd.
type Envd struct {
	URL     string
	HTTP    *http.Client
	Process processconnect.ProcessClient
}

// NewEnvd returns a client of the envd at url, dialing with dial (nil: the
// default dialer).
func NewEnvd(url string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *Envd {
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true}
	return NewEnvdWithClient(url, &http.Client{Transport: tr})
}

// NewEnvdWithClient returns a client of the envd at url that sends its
// requests with hc.
func NewEnvdWithClient(url string, hc *http.Client) *Envd {
	return &Envd{URL: url, HTTP: hc, Process: processconnect.NewProcessClient(hc, url)}
}

// WaitHealthy polls /health until it answers 204 or the timeout passes.
func (e *Envd) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/health", nil)
		resp, err := e.HTTP.Do(req)
		cancel()
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("envd at %s not healthy after %v: %v", e.URL, timeout, last)
}

// Result is how a command ended.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
}

// Run runs `sh -c script` as user (with the access token, if any) and
// waits for it to end.
func (e *Envd) Run(ctx context.Context, user, token, script string) (Result, error) {
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	if token != "" {
		req.Header().Set(wire.AccessTokenHeader, token)
	}
	stream, err := e.Process.Start(ctx, req)
	if err != nil {
		return Result{}, err
	}
	defer stream.Close()
	var out, errOut strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			errOut.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return Result{Stdout: out.String(), Stderr: errOut.String(), ExitCode: int(end.GetExitCode())}, nil
		}
	}
	if err := stream.Err(); err != nil {
		return Result{}, err
	}
	return Result{}, errors.New("the command's stream ended without an end event")
}

// ReadFile downloads the file at path as user (GET /files), which starts
// no process in the sandbox: it works in a sandbox that can fork no more.
func (e *Envd) ReadFile(ctx context.Context, user, token, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/files?"+url.Values{"path": {path}, "username": {user}}.Encode(), nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set(wire.AccessTokenHeader, token)
	}
	resp, err := e.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /files %s: %d %s", path, resp.StatusCode, body)
	}
	return string(body), nil
}
