package relay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/wire"
)

// wantWireError reads resp's body as e2b's error JSON with code status.
func wantWireError(t *testing.T, resp *http.Response, status int, contains string) wire.Error {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var e wire.Error
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q is not JSON: %v", body, err)
	}
	if resp.StatusCode != status || e.Code != status || !strings.Contains(e.Message, contains) {
		t.Fatalf("= %d %+v, want %d with code %d and %q", resp.StatusCode, e, status, status, contains)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	return e
}

// The relay's 502 for a port nothing listens on is e2b's proxy's JSON:
// {"sandboxId","message","port","code":502}.
func TestUnreachablePortIsE2bJSON(t *testing.T) {
	relay, _ := startRelay(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := portOf(t, "http://"+closed.Addr().String())
	closed.Close()

	resp, err := http.DefaultClient.Do(request(t, http.MethodGet, relay.URL, "/", deadPort, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	e := wantWireError(t, resp, http.StatusBadGateway, "The sandbox is running but port is not open")
	if strconv.Itoa(e.Port) != deadPort || e.SandboxID == "" {
		t.Fatalf("the body names port %d of %q; want %s of the sandbox", e.Port, e.SandboxID, deadPort)
	}
}

// A message that repeats a client's bytes — a quote, a backslash, bytes
// that are not UTF-8 — is still JSON with the right code. (The relay wrote
// its errors with strconv.Quote, whose escapes, \xff or \a, JSON does not
// have; routing's %q of the ID kept this message safe, but nothing made
// the next message so.)
func TestErrorWithClientBytesIsJSON(t *testing.T) {
	relay, _ := startRelay(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(relay.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	// The server takes any byte but controls in a header value; a client
	// library would not send these, so the request is written by hand.
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n%s: a\"b\\c\xff\xfe\r\n%s: 49983\r\nConnection: close\r\n\r\n",
		routing.HeaderSandboxID, routing.HeaderSandboxPort)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wantWireError(t, resp, http.StatusBadRequest, "sandbox ID")
}
