// Package e2e runs the single-host system for real: sandboxd (as root) with
// the base template, and sandbox-apiserver in single-host mode following it,
// both built from this workspace and run as their own processes; the test
// speaks e2b's REST API to the apiserver.
package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

type system struct {
	t        testing.TB
	dir      string
	api      string
	sandboxd string // host:port
	token    string // the node token
	keyA     string
	keyB     string
}

// start runs a daemon until the test ends (SIGTERM, then waits).
func start(t testing.TB, dir, name, bin string, args ...string) {
	t.Helper()
	hosttest.NewDaemon(t, dir, name, bin, args...).Start()
}

func newSystem(t testing.TB) *system {
	t.Helper()
	return newSystemWith(t)
}

// newSystemWith is newSystem with more flags for serve.
func newSystemWith(t testing.TB, serveArgs ...string) *system {
	t.Helper()
	h := hosttest.NewHost(t, hosttest.Options{Name: "api", NodeName: "host-a",
		Build: []string{"github.com/skiff-dev/skiff/apiserver/cmd/sandbox-apiserver"}})
	s := &system{t: t, dir: h.Dir, sandboxd: h.Addr, token: h.Token}
	apiserver := h.Bins["sandbox-apiserver"]
	keys := filepath.Join(h.Dir, "keys")
	for _, k := range []*string{&s.keyA, &s.keyB} {
		team := map[*string]string{&s.keyA: "team-a", &s.keyB: "team-b"}[k]
		out, err := exec.Command(apiserver, "keys", "create", "--team", team, "--api-keys-file", keys).Output()
		if err != nil {
			t.Fatal(err)
		}
		*k = strings.TrimSpace(string(out))
	}
	s.api = "http://" + hosttest.FreeAddr(t)
	// No per-team limits: the benchmarks create hundreds of sandboxes a
	// second; the limits have tests of their own (internal/cli).
	args := []string{"serve", "--listen", strings.TrimPrefix(s.api, "http://"),
		"--sandboxd", h.Addr, "--sandboxd-token-file", h.TokenFile, "--api-keys-file", keys, "--admin-listen", hosttest.FreeAddr(t),
		"--create-rate-per-team", "0", "--max-sandboxes-per-team", "0"}
	start(t, h.Dir, "apiserver", apiserver, append(args, serveArgs...)...)
	s.waitForHost()
	return s
}

// waitForHost waits until the apiserver lists the host's template: sandboxd
// is up and the apiserver follows its Watch stream.
func (s *system) waitForHost() {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		code, body := s.call(s.keyA, http.MethodGet, "/templates", nil)
		if code == http.StatusOK && strings.Contains(string(body), `"base"`) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatal("the apiserver never saw the host's base template")
}

func (s *system) call(key, method, path string, body any) (int, []byte) {
	s.t.Helper()
	var in bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&in).Encode(body); err != nil {
			s.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(method, s.api+path, &in)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

func TestSingleHostThroughTheE2BAPI(t *testing.T) {
	s := newSystem(t)

	// Create (v2: always a token), as team-a.
	code, body := s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120, "metadata": map[string]string{"purpose": "e2e"}})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct {
		SandboxID, ClientID, EnvdAccessToken, EnvdVersion string
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	if len(created.SandboxID) != 20 || created.ClientID != "host-a" || created.EnvdAccessToken == "" || created.EnvdVersion == "" {
		t.Fatalf("created %s", body)
	}
	id := created.SandboxID
	// Read-your-writes: it is listed and got at once.
	code, body = s.call(s.keyA, http.MethodGet, "/v2/sandboxes?metadata="+`purpose%3De2e`, nil)
	if code != http.StatusOK || !strings.Contains(string(body), id) {
		t.Errorf("list: %d %s", code, body)
	}
	if code, body = s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusOK || !strings.Contains(string(body), `"state":"running"`) {
		t.Errorf("get: %d %s", code, body)
	}
	// Another team sees nothing of it: 404 like a missing sandbox.
	if code, _ = s.call(s.keyB, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("get by another team: %d", code)
	}
	if code, body = s.call(s.keyB, http.MethodGet, "/v2/sandboxes", nil); code != http.StatusOK || strings.Contains(string(body), id) {
		t.Errorf("list by another team: %d %s", code, body)
	}
	if code, _ = s.call(s.keyB, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("kill by another team: %d", code)
	}
	// No key, or a wrong one: 401.
	if code, _ = s.call("", http.MethodGet, "/v2/sandboxes", nil); code != http.StatusUnauthorized {
		t.Errorf("no key: %d", code)
	}
	if code, _ = s.call("e2b_"+strings.Repeat("0", 40), http.MethodGet, "/v2/sandboxes", nil); code != http.StatusUnauthorized {
		t.Errorf("wrong key: %d", code)
	}
	// An unknown template is e2b's 404 naming it, and reaches no host.
	if code, body = s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "no-such"}); code != http.StatusNotFound || !strings.Contains(string(body), "template 'no-such' not found") {
		t.Errorf("unknown template: %d %s", code, body)
	}
	// Pause, pause again (409), connect resumes it (201), then kill (204),
	// then it is gone (404).
	if code, body = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/pause", nil); code != http.StatusNoContent {
		t.Errorf("pause: %d %s", code, body)
	}
	if code, _ = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/pause", nil); code != http.StatusConflict {
		t.Errorf("second pause: %d", code)
	}
	// A paused sandbox has no deadline to set: 404, as in e2b.
	if code, body = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 60}); code != http.StatusNotFound {
		t.Errorf("timeout of the paused sandbox: %d %s", code, body)
	}
	if code, body = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}); code != http.StatusCreated || !strings.Contains(string(body), created.EnvdAccessToken) {
		t.Errorf("connect to the paused sandbox: %d %s", code, body)
	}
	if code, _ = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}); code != http.StatusOK {
		t.Errorf("connect to the running sandbox: %d", code)
	}
	if code, _ = s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNoContent {
		t.Errorf("kill: %d", code)
	}
	if code, _ = s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("second kill: %d", code)
	}
	s.checkPrivateAutoResume(t)
}
