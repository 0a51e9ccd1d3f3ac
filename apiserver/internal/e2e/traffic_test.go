package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// relayGet sends GET path for port of sandbox id straight to sandboxd's
// relay (as the envd proxy would), with the node token and headers.
func (s *system) relayGet(t *testing.T, id string, port int, path string, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+s.sandboxd+path, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	req.Header.Set("Skiff-Node-Token", s.token)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("relay GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// checkPrivateAutoResume creates a sandbox with private traffic and
// auto-resume through the e2b API and checks, on the real sandboxd, that
// its user ports need the returned trafficAccessToken and that a request
// for its envd with its access token resumes it once paused (a health
// check does not).
func (s *system) checkPrivateAutoResume(t *testing.T) {
	code, body := s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{
		"templateID": "base", "timeout": 120, "autoResume": map[string]any{"enabled": true},
		"network": map[string]any{"allowPublicTraffic": false},
	})
	if code != http.StatusCreated {
		t.Fatalf("create private: %d %s", code, body)
	}
	var created struct {
		SandboxID          string
		EnvdAccessToken    string
		TrafficAccessToken *string
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	if created.TrafficAccessToken == nil || len(*created.TrafficAccessToken) != 64 {
		t.Fatalf("create private: trafficAccessToken in %s", body)
	}
	id, tok := created.SandboxID, *created.TrafficAccessToken
	code, body = s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"lifecycle":{"autoResume":true`) ||
		!strings.Contains(string(body), `"network":{"allowPublicTraffic":false}`) {
		t.Errorf("get private: %d %s", code, body)
	}
	// Nothing listens on 8080: past the token check the relay answers that
	// the port is not reachable.
	for _, tc := range []struct {
		token  string
		status int
		want   string
	}{{"", 403, "is missing"}, {strings.Repeat("0", 64), 403, "is invalid"}, {tok, 502, "The sandbox is running but port is not open"}} {
		h := map[string]string{}
		if tc.token != "" {
			h["E2b-Traffic-Access-Token"] = tc.token
		}
		if status, got := s.relayGet(t, id, 8080, "/", h); status != tc.status || !strings.Contains(got, tc.want) {
			t.Errorf("user port with token %q: %d %s, want %d %q", tc.token, status, got, tc.status, tc.want)
		}
	}
	if code, body = s.call(s.keyA, http.MethodPost, "/sandboxes/"+id+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, body)
	}
	// A health check without the sandbox's access token does not wake it
	// (envd takes one without a token): e2b's 403. A request with the
	// token does.
	if status, got := s.relayGet(t, id, 49983, "/health", nil); status != http.StatusForbidden {
		t.Errorf("envd /health of the paused auto-resume sandbox: %d %s, want e2b's 403", status, got)
	}
	if status, got := s.relayGet(t, id, 49983, "/envs", map[string]string{"X-Access-Token": created.EnvdAccessToken}); status/100 != 2 {
		t.Errorf("envd /envs of the paused auto-resume sandbox, with its token: %d %s", status, got)
	}
	if code, body = s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusOK || !strings.Contains(string(body), `"state":"running"`) {
		t.Errorf("get after auto-resume: %d %s", code, body)
	}
}
