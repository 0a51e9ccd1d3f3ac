package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"time"
)

// errEnvd is wrapped by every failure to reach or initialise a sandbox's
// envd; the API answers it as unavailable.
var errEnvd = errors.New("envd")

// EnvdInit is the body of envd's POST /init, in e2b's JSON names.
type EnvdInit struct {
	AccessToken    string            `json:"accessToken"`
	EnvVars        map[string]string `json:"envVars,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	Timestamp      string            `json:"timestamp,omitempty"`
}

// Envd talks to the envd inside a sandbox, at addr (host:port).
type Envd interface {
	// Health returns nil once envd answers GET /health.
	Health(ctx context.Context, addr string) error
	// Init posts in to /init, authenticated by the token envd holds now
	// ("" before the first /init), and returns envd's version.
	Init(ctx context.Context, addr, currentToken string, in *EnvdInit) (version string, err error)
}

// EnvdClient is Envd over HTTP. Its requests never go through a proxy and
// never carry a token in a URL, so no error it returns holds one.
type EnvdClient struct {
	client *http.Client
}

// NewEnvdClient returns an envd client whose requests each take at most
// timeout.
func NewEnvdClient(timeout time.Duration) *EnvdClient {
	return &EnvdClient{client: &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy: nil, // a sandbox's address is never behind the host's proxy
			// One kept connection per sandbox: a claim's /init then costs
			// no new connection into the sandbox's network namespace.
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     30 * time.Minute,
			ForceAttemptHTTP2:   false,
		},
	}}
}

// Health implements Envd.
func (c *EnvdClient) Health(ctx context.Context, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", http.NoBody)
	if err != nil {
		return fmt.Errorf("%w health: %w", errEnvd, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w health: %w", errEnvd, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%w health: status %d", errEnvd, resp.StatusCode)
	}
	return nil
}

// Init implements Envd.
func (c *EnvdClient) Init(ctx context.Context, addr, currentToken string, in *EnvdInit) (string, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return "", fmt.Errorf("%w init: encode body: %w", errEnvd, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/init", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("%w init: %w", errEnvd, err)
	}
	req.Header.Set("Content-Type", "application/json")
	// /init sets state; repeating it changes nothing. Saying so lets the
	// transport retry it on a kept connection envd closed meanwhile.
	req.Header.Set("Idempotency-Key", "")
	if currentToken != "" {
		req.Header.Set("X-Access-Token", currentToken)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w init: %w", errEnvd, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%w init: status %d: %s", errEnvd, resp.StatusCode, envdMessage(msg))
	}
	return resp.Header.Get("X-Envd-Version"), nil
}

// envdMessage is the message of envd's {"code","message"} error body, or
// the body itself, shortened.
func envdMessage(body []byte) string {
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

// waitEnvd polls envd's /health until it answers, with a backoff from 1 ms
// doubling up to 50 ms, for at most timeout (in real time: it waits on a
// network peer, not on the sandbox's clock).
func waitEnvd(ctx context.Context, e Envd, addr string, timeout time.Duration) error {
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Short, capped waits: until envd listens, a try is one refused
	// connection, and a long wait would only add to the create.
	backoff := 500 * time.Microsecond
	for {
		err := e.Health(waitCtx, addr)
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
			return fmt.Errorf("%w did not answer within %s: %w", errEnvd, timeout, err)
		case <-t.C:
		}
		backoff = min(backoff*2, 4*time.Millisecond)
	}
}

// newToken returns a fresh secret: 32 random bytes, hex. (envd access
// tokens carry the sandbox ID in front: sandboxid.NewAccessToken.)
func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// EnvdVersion asks the envd binary at path for the version it advertises
// (`envd --version`).
func EnvdVersion(ctx context.Context, path string) (string, error) {
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
