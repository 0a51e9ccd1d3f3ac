// Package envdclient is sandboxd's side of the envd in each sandbox: it
// waits for envd to answer /health, hands it its token and environment
// through POST /init (wire.EnvdInit, the body every module spells the same
// way), and asks an envd binary which version it advertises.
//
// Every failure to reach or initialise an envd wraps ErrEnvd, which the API
// answers as unavailable. Requests never go through a proxy and never carry
// a token in a URL, so no error this package returns holds one.
package envdclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"time"

	"github.com/skiff-dev/skiff/shared/tracing"
	"github.com/skiff-dev/skiff/wire"
)

// ErrEnvd is wrapped by every failure to reach or initialise a sandbox's
// envd. Its text, "envd", begins those errors' messages.
var ErrEnvd = errors.New("envd")

// DefaultTimeout is the least time one request to envd may take.
const DefaultTimeout = 10 * time.Second

// Client is envd's HTTP API at a sandbox's address (host:port).
type Client struct {
	client *http.Client
}

// New returns a client whose requests each take at most timeout.
func New(timeout time.Duration) *Client {
	tr := &http.Transport{
		Proxy: nil, // a sandbox's address is never behind the host's proxy
		// One kept connection per sandbox: a claim's /init then costs
		// no new connection into the sandbox's network namespace.
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Minute,
		ForceAttemptHTTP2:   false,
		// A restored sandbox's port may be answered by its tenant's own
		// process: envd's headers are a few hundred bytes.
		MaxResponseHeaderBytes: 64 << 10,
	}
	// With tracing on, /init is a client span ("envd /init") and envd gets
	// its traceparent; the polls of /health are not (WaitHealthy's caller
	// spans the wait).
	return &Client{client: &http.Client{
		Timeout:   timeout,
		Transport: tracing.Transport(tr, func(r *http.Request) string { return "envd " + r.URL.Path }, notHealth),
	}}
}

func notHealth(r *http.Request) bool { return r.URL.Path != "/health" }

// Health returns nil once envd at addr answers GET /health.
func (c *Client) Health(ctx context.Context, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", http.NoBody)
	if err != nil {
		return fmt.Errorf("%w health: %w", ErrEnvd, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w health: %w", ErrEnvd, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%w health: status %d", ErrEnvd, resp.StatusCode)
	}
	return nil
}

// WaitHealthy polls envd's /health until it answers, for at most timeout
// (in real time: it waits on a network peer, not on the sandbox's clock).
// Between tries it waits from half a millisecond, doubling up to 4 ms:
// until envd listens, a try is one refused connection, and a long wait
// would only add to the create.
func (c *Client) WaitHealthy(ctx context.Context, addr string, timeout time.Duration) error {
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	backoff := 500 * time.Microsecond
	for {
		err := c.Health(waitCtx, addr)
		if err == nil {
			return nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-waitCtx.Done():
			t.Stop()
			if ctx.Err() != nil {
				return fmt.Errorf("wait for envd: %w", ctx.Err())
			}
			return fmt.Errorf("%w did not answer within %s: %w", ErrEnvd, timeout, err)
		case <-t.C:
		}
		backoff = min(backoff*2, 4*time.Millisecond)
	}
}

// Init posts in to envd's /init, authenticated by the token envd holds now
// ("" before the first /init), and returns the version envd advertises.
func (c *Client) Init(ctx context.Context, addr, currentToken string, in *wire.EnvdInit) (string, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return "", fmt.Errorf("%w init: encode body: %w", ErrEnvd, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/init", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("%w init: %w", ErrEnvd, err)
	}
	req.Header.Set("Content-Type", "application/json")
	// /init sets state; repeating it changes nothing. Saying so lets the
	// transport retry it on a kept connection envd closed meanwhile.
	req.Header.Set("Idempotency-Key", "")
	if currentToken != "" {
		req.Header.Set(wire.AccessTokenHeader, currentToken)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w init: %w", ErrEnvd, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%w init: status %d: %s", ErrEnvd, resp.StatusCode, message(msg))
	}
	version := resp.Header.Get("X-Envd-Version")
	if !validVersion(version) {
		// A sandbox restored from a snapshot answers with whatever process
		// its tenant left on envd's port. What it says goes into the
		// host's inventory, the API's answers and the SDK's checks.
		shown := version
		if len(shown) > 40 {
			shown = shown[:40] + "…"
		}
		return "", fmt.Errorf("%w init: the version it advertises (%d bytes: %q) is not a version", ErrEnvd, len(version), shown)
	}
	return version, nil
}

// maxVersionLen is the longest version a sandbox's envd may advertise: the
// inventory's schema holds no more (v1beta1.MaxEnvdVersionLength, which
// this module does not import).
const maxVersionLen = 32

// validVersion reports whether v is a version as envd advertises one
// (MAJOR.MINOR.PATCH, with a pre-release or build suffix) of at most
// maxVersionLen characters, or empty (an envd that advertises none).
func validVersion(v string) bool {
	if v == "" {
		return true
	}
	if len(v) > maxVersionLen {
		return false
	}
	core, suffix, _ := strings.Cut(v, "-")
	if i := strings.IndexByte(core, '+'); i >= 0 {
		core, suffix = core[:i], core[i+1:]
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return strings.Trim(suffix, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-") == ""
}

// WriteFile writes content to path inside the sandbox as root, through
// envd's POST /files, authenticated by token.
func (c *Client) WriteFile(ctx context.Context, addr, token, path string, content []byte) error {
	u := "http://" + addr + "/files?" + url.Values{"path": {path}, "username": {"root"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(content))
	if err != nil {
		return fmt.Errorf("%w write %s: %w", ErrEnvd, path, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if token != "" {
		req.Header.Set(wire.AccessTokenHeader, token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w write %s: %w", ErrEnvd, path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%w write %s: status %d: %s", ErrEnvd, path, resp.StatusCode, message(msg))
	}
	return nil
}

// message is the message of envd's {"code","message"} error body, or the
// body itself, shortened.
func message(body []byte) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil && e.Message != "" {
		return e.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Version asks the envd binary at path for the version it advertises
// (`envd --version`).
func Version(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", path, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", fmt.Errorf("%s --version printed nothing", path)
	}
	return fields[len(fields)-1], nil // "0.6.4", or "envd 0.6.4"
}
