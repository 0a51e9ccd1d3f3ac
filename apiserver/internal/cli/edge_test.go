package cli

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawCall sends one HTTP/1.1 request written by hand to addr (host:port),
// so that the path goes out exactly as given, and returns the answer with
// its body read.
func rawCall(t *testing.T, addr, method, path, key string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	req := method + " " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n"
	if key != "" {
		req += "X-API-Key: " + key + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, string(body)
}

// wantE2BError checks that an answer is e2b's error shape with status want.
func wantE2BError(t *testing.T, what string, resp *http.Response, body string, want int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if resp.StatusCode != want || json.Unmarshal([]byte(body), &e) != nil || e.Code != want || e.Message == "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("%s = %d %s %q, want %d in e2b's error shape", what, resp.StatusCode, resp.Header.Get("Content-Type"), body, want)
	}
}

// A path that is not canonical names no route: 404 in e2b's shape, as
// docs/e2b-compat.md says, never the redirect Go's ServeMux would send;
// without a key it is the 401 of every other route.
func TestNonCanonicalPathsAnswer404(t *testing.T) {
	o, key := staticOptions(t, []string{closedAddr(t)})
	s := startServing(t, o)
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
	addr := strings.TrimPrefix(s.api, "http://")
	for _, path := range []string{"/a/../v2/sandboxes", "//v2/sandboxes", "/v2//sandboxes", "/./v2/sandboxes", "/v2/sandboxes/.", "//health", "/x/../health"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			resp, body := rawCall(t, addr, method, path, key)
			wantE2BError(t, method+" "+path, resp, body, http.StatusNotFound)
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("%s %s: Location %q", method, path, loc)
			}
			resp, body = rawCall(t, addr, method, path, "")
			wantE2BError(t, method+" "+path+" without a key", resp, body, http.StatusUnauthorized)
		}
	}
	// The canonical paths still answer.
	if resp, body := rawCall(t, addr, http.MethodGet, "/v2/sandboxes", key); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v2/sandboxes = %d %q", resp.StatusCode, body)
	}
	if resp, body := rawCall(t, addr, http.MethodGet, "/health", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health = %d %q", resp.StatusCode, body)
	}
}
