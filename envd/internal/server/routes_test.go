package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// reply is a response read whole.
type reply struct {
	StatusCode int
	Header     http.Header
}

// do sends a request and reads the whole response.
func do(t *testing.T, method, url string, body io.Reader, headers map[string]string) (reply, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header}, data
}

func TestEnvsAndMetrics(t *testing.T) {
	e := startEnvd(t)
	resp, body := do(t, http.MethodPost, e.url+"/init", strings.NewReader(`{"envVars":{"A":"1"},"accessToken":"tok"}`), map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init = %d %s", resp.StatusCode, body)
	}

	resp, body = do(t, http.MethodGet, e.url+"/envs", nil, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"code":401`) {
		t.Fatalf("envs without token = %d %s, want 401 in e2b's shape", resp.StatusCode, body)
	}
	resp, body = do(t, http.MethodGet, e.url+"/envs", nil, map[string]string{"X-Access-Token": "tok"})
	var envs map[string]string
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &envs) != nil || envs["A"] != "1" || envs["E2B_SANDBOX"] != "true" {
		t.Fatalf("envs = %d %s, want A=1 and E2B_SANDBOX=true", resp.StatusCode, body)
	}

	for range 2 { // the second call measures CPU since the first
		resp, body = do(t, http.MethodGet, e.url+"/metrics", nil, map[string]string{"X-Access-Token": "tok"})
		var m map[string]float64
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &m) != nil {
			t.Fatalf("metrics = %d %s", resp.StatusCode, body)
		}
		for _, k := range []string{"ts", "cpu_count", "mem_total", "mem_used", "mem_total_mib", "disk_total", "disk_used"} {
			if m[k] <= 0 {
				t.Errorf("metrics %s = %v, want > 0 (%s)", k, m[k], body)
			}
		}
		if _, ok := m["cpu_used_pct"]; !ok || m["cpu_used_pct"] < 0 || m["cpu_used_pct"] > 100 {
			t.Errorf("metrics cpu_used_pct = %v, want 0..100", m["cpu_used_pct"])
		}
		if m["mem_used"] > m["mem_total"] || m["disk_used"] > m["disk_total"] {
			t.Errorf("metrics used above total: %s", body)
		}
	}
}

// Bad input gets a clear error: never a panic, a hang or a 500.
func TestBadInput(t *testing.T) {
	e := startEnvd(t)
	for _, tc := range []struct {
		name    string
		method  string
		path    string
		body    []byte
		headers map[string]string
		status  int
	}{
		{"unknown route", http.MethodGet, "/nope", nil, nil, http.StatusNotFound},
		{"unknown RPC", http.MethodPost, "/process.Process/Nope", []byte("{}"), map[string]string{"Content-Type": "application/json"}, http.StatusNotFound},
		{"unary GET", http.MethodGet, "/process.Process/List", nil, nil, http.StatusMethodNotAllowed},
		{"wrong content type", http.MethodPost, "/process.Process/List", []byte("{}"), map[string]string{"Content-Type": "text/plain"}, http.StatusUnsupportedMediaType},
		{"malformed JSON", http.MethodPost, "/filesystem.Filesystem/Stat", []byte("{not json"), map[string]string{"Content-Type": "application/json"}, http.StatusBadRequest},
		{"unknown enum", http.MethodPost, "/process.Process/SendSignal", []byte(`{"signal":"SIGNAL_NOPE"}`), map[string]string{"Content-Type": "application/json"}, http.StatusBadRequest},
		{"huge header", http.MethodGet, "/health", nil, map[string]string{"X-Huge": strings.Repeat("x", 2<<20)}, http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, tc.method, e.url+tc.path, bytes.NewReader(tc.body), tc.headers)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
		})
	}

	// A stream whose envelope is cut short ends with an error in the
	// end-of-stream message, not a hang.
	resp, body := do(t, http.MethodPost, e.url+"/process.Process/Start", bytes.NewReader([]byte{0, 0, 0, 0, 50, '{'}),
		map[string]string{"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"error"`)) || bytes.Contains(body, []byte(`"start"`)) {
		t.Fatalf("truncated envelope = %d %q, want 200 with an end-of-stream error and no start", resp.StatusCode, body)
	}
}

func TestCORSPreflight(t *testing.T) {
	e := startEnvd(t)
	resp, _ := do(t, http.MethodOptions, e.url+"/process.Process/Start", nil, map[string]string{
		"Origin": "https://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,x-access-token",
	})
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || h.Get("Access-Control-Allow-Headers") != "content-type,x-access-token" {
		t.Fatalf("preflight = %d %v", resp.StatusCode, h)
	}
	resp, _ = do(t, http.MethodGet, e.url+"/health", nil, map[string]string{"Origin": "https://app.example"})
	if resp.Header.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "Grpc-Status") {
		t.Fatalf("simple request headers = %v", resp.Header)
	}
}

// The filesystem service answers the Python SDK before 1.7.1 (User-Agent
// connect-python) as e2b's envd does: an entry with its name, type and
// path only, and X-E2B-Legacy-SDK: true. Any other client gets the whole
// entry.
func TestLegacyPythonSDKAnswers(t *testing.T) {
	e := startEnvd(t)
	for ua, trimmed := range map[string]bool{"connect-python": true, "e2b-python-sdk/2.3.0": false} {
		resp, body := do(t, http.MethodPost, e.url+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/"}`),
			map[string]string{"Content-Type": "application/json", "User-Agent": ua})
		var got struct{ Entry map[string]any }
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Entry["name"] == nil || got.Entry["path"] != "/" {
			t.Fatalf("Stat / as %s = %d %s", ua, resp.StatusCode, body)
		}
		_, hasPermissions := got.Entry["permissions"]
		if hasPermissions == trimmed || (resp.Header.Get("X-E2B-Legacy-SDK") == "true") != trimmed {
			t.Errorf("Stat / as %s: %s (X-E2B-Legacy-SDK %q); want it trimmed: %v", ua, body, resp.Header.Get("X-E2B-Legacy-SDK"), trimmed)
		}
	}
}
