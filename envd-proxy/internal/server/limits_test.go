package server

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/envd-proxy/internal/proxy"
)

// e2bError checks that body is e2b's error shape with code want.
func e2bError(t *testing.T, what string, status int, body string, want int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if status != want || json.Unmarshal([]byte(body), &e) != nil || e.Code != want || e.Message == "" {
		t.Errorf("%s: %d %q, want %d in e2b's error shape", what, status, body, want)
	}
}

// dialProxy opens a client connection to addr; a hang ends at the
// connection's deadline.
func dialProxy(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn, bufio.NewReader(conn)
}

// answer is a response whose body was read and closed.
type answer struct {
	StatusCode int
	Header     http.Header
	Close      bool
}

// readAnswer reads one response from br, body included.
func readAnswer(t *testing.T, br *bufio.Reader) (answer, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("read the answer's body: %v", err)
	}
	return answer{StatusCode: resp.StatusCode, Header: resp.Header, Close: resp.Close}, string(b)
}

// A request body that sends nothing for --body-idle-timeout is cut with
// 408 and loses its connection, over HTTP/1.1 and HTTP/2; a body that
// keeps moving, for longer than the timeout in all, goes through whole,
// and so does a long answer after the body.
func TestIdleBodyIsCut(t *testing.T) {
	const idle = 300 * time.Millisecond
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return // cut
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = fmt.Fprintf(w, "got %d", n)
		// A stream's answer after its request: pauses longer than idle.
		for range r.URL.Query().Get("pauses") {
			http.NewResponseController(w).Flush()
			time.Sleep(2 * idle)
			_, _ = io.WriteString(w, ".")
		}
	})
	h, id := proxyWith(t, upstream, proxy.Config{BodyIdleTimeout: idle})
	cert, pool := selfSigned(t)
	plain := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: time.Second})
	secure := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: time.Second,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}})

	headers := func(path string, length int) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: " + id + "\r\nE2b-Sandbox-Port: 49983\r\nContent-Length: " +
			strconv.Itoa(length) + "\r\n\r\n"
	}

	t.Run("HTTP/1.1 stalled", func(t *testing.T) {
		conn, br := dialProxy(t, plain.addr)
		begin := time.Now()
		if _, err := io.WriteString(conn, headers("/files?path=%2Fa", 100)+"0123456789"); err != nil {
			t.Fatal(err)
		}
		resp, body := readAnswer(t, br)
		e2bError(t, "a stalled body", resp.StatusCode, body, http.StatusRequestTimeout)
		if d := time.Since(begin); d > 10*idle {
			t.Errorf("cut after %s, with an idle timeout of %s", d, idle)
		}
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("the connection stays open after the 408: %v", err)
		}
	})

	t.Run("HTTP/1.1 stalled, answered by the proxy itself", func(t *testing.T) {
		conn, br := dialProxy(t, plain.addr)
		if _, err := io.WriteString(conn, headers("/init", 100)+"0123456789"); err != nil {
			t.Fatal(err)
		}
		resp, body := readAnswer(t, br)
		e2bError(t, "a blocked path", resp.StatusCode, body, http.StatusNotFound)
		// The server drains the rest of the body before the next request:
		// the body's deadline bounds that too.
		begin := time.Now()
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("the connection of a stalled body stays open: %v", err)
		}
		if d := time.Since(begin); d > 10*idle {
			t.Errorf("closed after %s, with an idle timeout of %s", d, idle)
		}
	})

	t.Run("HTTP/1.1 moving, then a long answer", func(t *testing.T) {
		conn, br := dialProxy(t, plain.addr)
		if _, err := io.WriteString(conn, headers("/files?pauses=xx", 40)); err != nil {
			t.Fatal(err)
		}
		for range 4 { // 4 × idle/2 in all: longer than idle
			time.Sleep(idle / 2)
			if _, err := io.WriteString(conn, "0123456789"); err != nil {
				t.Fatal(err)
			}
		}
		resp, body := readAnswer(t, br)
		if resp.StatusCode != http.StatusOK || body != "got 40.." {
			t.Fatalf("a moving body: %d %q, want 200 \"got 40..\"", resp.StatusCode, body)
		}
		// The connection is kept and serves the next request.
		if _, err := io.WriteString(conn, headers("/files", 3)+"abc"); err != nil {
			t.Fatal(err)
		}
		if resp, body := readAnswer(t, br); resp.StatusCode != http.StatusOK || body != "got 3" {
			t.Fatalf("the next request: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("HTTP/2 stalled", func(t *testing.T) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		pr, pw := io.Pipe()
		t.Cleanup(func() { _ = pw.Close() })
		go func() { _, _ = io.WriteString(pw, "0123456789") }() // then nothing
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+secure.addr+"/files", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Errorf("spoke %s", resp.Proto)
		}
		e2bError(t, "a stalled HTTP/2 body", resp.StatusCode, string(b), http.StatusRequestTimeout)
	})
}

// An upload that the sandbox answers before reading it (envd's 401 or 507,
// an app's 413) must not leave the unread rest of its body on a connection
// that serves another request: that rest would be parsed as the next
// requests. net/http closes the connection after such an answer only when
// the server's request still has net/http's own body (it looks at its
// type), and full duplex skips the drain; so the body idle timeout wraps
// only the body of the forwarded request.
func TestTheServersRequestKeepsItsBody(t *testing.T) {
	upstream := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"code":401,"message":"invalid access token"}`)
	})
	h, id := proxyWith(t, upstream, proxy.Config{BodyIdleTimeout: time.Minute})
	bodyTypes := make(chan string, 4)
	srv := start(t, Config{IdleTimeout: time.Minute, ShutdownTimeout: time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r)
			bodyTypes <- fmt.Sprintf("%T", r.Body)
		})})

	// Far more than net/http drains after an answer (256 KiB), made of
	// requests, as a smuggler's would be.
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: " + id + "\r\nE2b-Sandbox-Port: 49983\r\n\r\n"
	body := strings.Repeat(smuggled, (4<<20)/len(smuggled))
	conn, br := dialProxy(t, srv.addr)
	go func() {
		// Fails once the proxy closes the connection, as it must.
		_, _ = io.WriteString(conn, "POST /files?path=%2Fbig HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: "+id+
			"\r\nE2b-Sandbox-Port: 49983\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	}()
	resp, _ := readAnswer(t, br)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the upload: %d, want the sandbox's 401", resp.StatusCode)
	}
	if typ := <-bodyTypes; typ != "*http.body" {
		t.Errorf("the server's request has a body of type %s after the handler, want net/http's own *http.body", typ)
	}
	// The connection closes after the answer; nothing of the body is
	// answered as a request of its own.
	if line, err := br.ReadString('\n'); line != "" || err == nil {
		t.Errorf("after the early answer the connection served more: %q (%v), want it closed", line, err)
	}
}

// A client beyond --max-conns-per-client open connections gets 429 in
// e2b's shape on each request of the extra connection, which then closes;
// once one of its connections closes, it may open another. Other clients
// are not affected (here: the same client over TLS, whose connections sit
// beneath TLS).
func TestConnectionCapPerClient(t *testing.T) {
	h, id := proxyWith(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), proxy.Config{})
	srv := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: time.Second,
		MaxConnsPerClient: 2, OverLimit: http.HandlerFunc(h.TooManyConnections)})
	request := "GET / HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: " + id + "\r\nE2b-Sandbox-Port: 8080\r\n\r\n"
	call := func(conn net.Conn, br *bufio.Reader) (answer, string) {
		t.Helper()
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		return readAnswer(t, br)
	}

	c1, b1 := dialProxy(t, srv.addr)
	c2, b2 := dialProxy(t, srv.addr)
	for i, c := range []struct {
		conn net.Conn
		br   *bufio.Reader
	}{{c1, b1}, {c2, b2}} {
		if resp, body := call(c.conn, c.br); resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("connection %d within the cap: %d %q", i+1, resp.StatusCode, body)
		}
	}
	c3, b3 := dialProxy(t, srv.addr)
	resp, body := call(c3, b3)
	e2bError(t, "a third connection", resp.StatusCode, body, http.StatusTooManyRequests)
	if !resp.Close || resp.Header.Get("Retry-After") == "" {
		t.Errorf("the 429 closes %v, Retry-After %q", resp.Close, resp.Header.Get("Retry-After"))
	}
	if _, err := b3.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("the third connection stays open: %v", err)
	}
	// The first two still serve.
	if resp, _ := call(c1, b1); resp.StatusCode != http.StatusOK {
		t.Fatalf("connection 1 after the refusal: %d", resp.StatusCode)
	}
	// One closes: a new one is within the cap again, once the proxy has
	// seen the close.
	_ = c2.Close()
	waitFor(t, "a new connection is served", func() bool {
		c, br := dialProxy(t, srv.addr)
		defer c.Close()
		resp, _ := call(c, br)
		return resp.StatusCode == http.StatusOK
	})

	// Beneath TLS (HTTP/2 here) the connection is counted the same way.
	cert, pool := selfSigned(t)
	tlsSrv := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: time.Second,
		MaxConnsPerClient: 1, OverLimit: http.HandlerFunc(h.TooManyConnections),
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}})
	status := func(tr *http.Transport) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+tlsSrv.addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "8080")
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests && !strings.Contains(string(b), `"code":429`) {
			t.Errorf("the TLS 429 is not e2b's shape: %q", b)
		}
		return resp.StatusCode
	}
	first := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
	second := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
	t.Cleanup(first.CloseIdleConnections)
	t.Cleanup(second.CloseIdleConnections)
	if code := status(first); code != http.StatusOK {
		t.Fatalf("the first TLS connection: %d", code)
	}
	if code := status(second); code != http.StatusTooManyRequests {
		t.Fatalf("a second TLS connection beyond a cap of 1: %d, want 429", code)
	}
}

// Behind a trusted reverse proxy (--trusted-proxies) the proxy's
// connections are not counted, however many it opens; each request counts
// while in flight for the client X-Forwarded-For names (its rightmost
// address that is not a trusted proxy's: what a client writes to its left
// changes nothing), and one beyond the cap gets 429 in e2b's shape on a
// connection that stays open for the proxy's other clients.
func TestTrustedProxyClientsCountedByRequest(t *testing.T) {
	release := make(chan struct{})
	var slow atomic.Int32 // slow requests that reached the stand-in sandboxd
	h, id := proxyWith(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slow.Add(1)
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}), proxy.Config{})
	// Before the stand-in sandboxd closes, which waits for its handlers.
	var releaseOnce sync.Once
	done := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(done)
	const maxPerClient = 2
	srv := start(t, Config{Handler: h, IdleTimeout: time.Minute, ShutdownTimeout: time.Second,
		MaxConnsPerClient: maxPerClient, OverLimit: http.HandlerFunc(h.TooManyConnections),
		TrustedProxies:  []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		TooManyRequests: http.HandlerFunc(h.TooManyRequests)})
	send := func(conn net.Conn, path, xff string) {
		t.Helper()
		req := "GET " + path + " HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: " + id + "\r\nE2b-Sandbox-Port: 8080\r\n"
		if xff != "" {
			req += "X-Forwarded-For: " + xff + "\r\n"
		}
		if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	call := func(conn net.Conn, br *bufio.Reader, path, xff string) (answer, string) {
		t.Helper()
		send(conn, path, xff)
		return readAnswer(t, br)
	}

	// Four connections at once from the trusted proxy, beyond a cap of
	// two: each serves.
	var conns []net.Conn
	var readers []*bufio.Reader
	for i := range maxPerClient + 2 {
		c, br := dialProxy(t, srv.addr)
		conns, readers = append(conns, c), append(readers, br)
		if resp, body := call(c, br, "/", "10.0.0.1"); resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("connection %d of the trusted proxy: %d %q", i+1, resp.StatusCode, body)
		}
	}

	// Client 10.0.0.3 has two requests in flight: its next is refused,
	// under whatever it puts to the left, and another client's passes on
	// the same connection. (A fresh client: a request counts until its
	// handler has returned, which may be a moment after its answer.)
	send(conns[0], "/slow", "10.0.0.3")
	send(conns[1], "/slow", "10.0.0.3")
	waitFor(t, "both slow requests are in flight", func() bool { return slow.Load() == 2 })
	for _, xff := range []string{"10.0.0.3", "10.9.9.9, 10.0.0.3", "10.0.0.3, 127.0.0.1", "[::ffff:10.0.0.3]:4000", "[::ffff:10.0.0.3]"} {
		resp, body := call(conns[2], readers[2], "/", xff)
		e2bError(t, "client 10.0.0.3 beyond its cap (X-Forwarded-For: "+xff+")", resp.StatusCode, body, http.StatusTooManyRequests)
		if resp.Close || resp.Header.Get("Retry-After") == "" {
			t.Errorf("the 429 closes the trusted proxy's connection %v, Retry-After %q", resp.Close, resp.Header.Get("Retry-After"))
		}
	}
	if resp, body := call(conns[2], readers[2], "/", "10.0.0.2"); resp.StatusCode != http.StatusOK {
		t.Errorf("another client on the same connection: %d %q", resp.StatusCode, body)
	}
	// A hop it cannot read ends the walk: what is left of it is the
	// client's say, and the request counts for the trusted proxy.
	if resp, body := call(conns[2], readers[2], "/", "10.0.0.3, unknown"); resp.StatusCode != http.StatusOK {
		t.Errorf("X-Forwarded-For with an unreadable hop on the right: %d %q", resp.StatusCode, body)
	}
	// A client that connects directly (127.0.0.2, not trusted) is counted
	// by its connections: what it writes in X-Forwarded-For counts for
	// nobody.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 10 * time.Second}
	direct, err := d.DialContext(t.Context(), "tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	_ = direct.SetDeadline(time.Now().Add(20 * time.Second))
	if resp, body := call(direct, bufio.NewReader(direct), "/", "10.0.0.3"); resp.StatusCode != http.StatusOK {
		t.Errorf("a direct client naming a client at its cap: %d %q", resp.StatusCode, body)
	}
	// Without X-Forwarded-For, the trusted proxy itself is the client.
	if resp, _ := call(conns[3], readers[3], "/", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("a request without X-Forwarded-For: %d", resp.StatusCode)
	}

	// Its requests done, the client is within its cap again.
	done()
	for i := range 2 {
		if resp, body := readAnswer(t, readers[i]); resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("slow request %d: %d %q", i+1, resp.StatusCode, body)
		}
	}
	waitFor(t, "client 10.0.0.3 is served after its requests ended", func() bool {
		resp, _ := call(conns[2], readers[2], "/", "10.0.0.3")
		return resp.StatusCode == http.StatusOK
	})
}
