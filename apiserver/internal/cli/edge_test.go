package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// answer is a response whose body was read and closed.
type answer struct {
	StatusCode int
	Header     http.Header
}

// rawCall sends one HTTP/1.1 request written by hand to addr (host:port),
// so that the path goes out exactly as given, and returns the answer with
// its body read.
func rawCall(t *testing.T, addr, method, path, key string) (answer, string) {
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
	return answer{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
}

// wantE2BError checks that an answer is e2b's error shape with status want.
func wantE2BError(t *testing.T, what string, resp answer, body string, want int) {
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

// A body that does not arrive within --read-timeout answers 408 in e2b's
// shape and loses its connection; a body that arrives in time and a
// keep-alive connection idle for longer than the timeout are not cut.
func TestSlowBodyAnswers408(t *testing.T) {
	const timeout = 500 * time.Millisecond
	o, key := staticOptions(t, []string{closedAddr(t)}, "--read-timeout", timeout.String())
	s := startServing(t, o)
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
	addr := strings.TrimPrefix(s.api, "http://")

	// send writes a create's headers and then the body in parts, pause
	// apart; it returns the connection and a reader of its answers.
	send := func(t *testing.T, parts []string, pause time.Duration) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second)) // a hang fails, not blocks
		body := `{"templateID":"ruby","timeout":60}`
		if _, err := io.WriteString(conn, "POST /v2/sandboxes HTTP/1.1\r\nHost: "+addr+"\r\nX-API-Key: "+key+
			"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		for i, p := range parts {
			if i > 0 {
				time.Sleep(pause)
			}
			if _, err := io.WriteString(conn, p); err != nil {
				t.Fatal(err)
			}
		}
		return conn, bufio.NewReader(conn)
	}

	t.Run("stalled body", func(t *testing.T) {
		start := time.Now()
		_, br := send(t, []string{`{"templateID":`}, 0)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer to a stalled body: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		wantE2BError(t, "a stalled body", answer{resp.StatusCode, resp.Header}, string(b), http.StatusRequestTimeout)
		if strings.Contains(string(b), "127.0.0.1") {
			t.Errorf("the answer names an address: %s", b)
		}
		if d := time.Since(start); d > 10*timeout {
			t.Errorf("answered after %s, with a read timeout of %s", d, timeout)
		}
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("the connection stays open after the 408: %v", err)
		}
	})

	t.Run("body in time, keep-alive idle longer", func(t *testing.T) {
		body := `{"templateID":"ruby","timeout":60}`
		conn, br := send(t, []string{body[:10], body[10:20], body[20:]}, timeout/5)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		wantE2BError(t, "a body sent in parts", answer{resp.StatusCode, resp.Header}, string(b), http.StatusNotFound) // the unknown template
		time.Sleep(2 * timeout)
		if _, err := io.WriteString(conn, "GET /v2/sandboxes HTTP/1.1\r\nHost: "+addr+"\r\nX-API-Key: "+key+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("the next request on the kept connection: %v", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the next request on the kept connection: %d", resp.StatusCode)
		}
	})
}
