package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/routing"
)

// resolver knows sandboxID, public and running at 127.0.0.1, and whatever
// a test adds; it counts lookups.
type resolver struct {
	calls     atomic.Int32
	mu        sync.Mutex
	sandboxes map[string]Sandbox
}

const sandboxID = "sbx0000000000000test"

func newResolver() *resolver {
	return &resolver{sandboxes: map[string]Sandbox{sandboxID: {Address: "127.0.0.1"}}}
}

func (r *resolver) Resolve(_ context.Context, id string) (Sandbox, error) {
	r.calls.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.sandboxes[id]; ok {
		return sb, nil
	}
	return Sandbox{}, fmt.Errorf("%w: %s", ErrUnknownSandbox, id)
}

func (r *resolver) set(id string, sb Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sandboxes[id] = sb
}

func (r *resolver) get(id string) Sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sandboxes[id]
}

func startRelay(t *testing.T) (*httptest.Server, *resolver) {
	t.Helper()
	res := newResolver()
	srv := httptest.NewServer(New(res))
	t.Cleanup(srv.Close)
	return srv, res
}

func portOf(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

func request(t testing.TB, method, relayURL, path, port string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, relayURL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(routing.HeaderSandboxID, sandboxID)
	req.Header.Set(routing.HeaderSandboxPort, port)
	return req
}

func TestForwards(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s token=%s", r.Method, r.URL.RequestURI(), r.Header.Get("X-Access-Token"))
	}))
	defer upstream.Close()
	relay, _ := startRelay(t)
	req := request(t, http.MethodGet, relay.URL, "/files?path=%2Fa%20b", portOf(t, upstream.URL), nil)
	req.Header.Set("X-Access-Token", "tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "GET /files?path=%2Fa%20b token=tok" {
		t.Fatalf("relayed = %d %q", resp.StatusCode, body)
	}

	// Host routing reaches the same place.
	hostReq, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, relay.URL+"/h", nil)
	hostReq.Host = portOf(t, upstream.URL) + "-" + sandboxID + ".sandbox.example.com"
	resp, err = http.DefaultClient.Do(hostReq)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "GET /h token=" {
		t.Fatalf("host-routed = %d %q", resp.StatusCode, body)
	}
}

// An answer whose headers pass 1 MiB (a tenant's server) is a 502, not
// held in sandboxd's memory; one just under passes.
func TestAnswerHeadersBounded(t *testing.T) {
	for kib, want := range map[int]int{900: http.StatusOK, 2048: http.StatusBadGateway} {
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			for i := range kib / 32 {
				w.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("h", 32<<10))
			}
			_, _ = io.WriteString(w, "body")
		}))
		relay, _ := startRelay(t)
		resp, err := http.DefaultClient.Do(request(t, http.MethodGet, relay.URL, "/", portOf(t, upstream.URL), nil))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		upstream.Close()
		if resp.StatusCode != want {
			t.Errorf("an answer with %d KiB of headers: %d, want %d", kib, resp.StatusCode, want)
		}
	}
}

// Bodies pass as they are: a client that asks for no encoding gets none
// asked of the sandbox either (Go's transport would ask for gzip and unpack
// it, costing two thirds of a download's throughput), and one that asks for
// gzip gets the sandbox's gzip bytes, with the header, unpacked by nobody.
func TestNoCompressionOfItsOwn(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write([]byte("not really gzip"))
			return
		}
		fmt.Fprintf(w, "accept-encoding=%q", r.Header.Get("Accept-Encoding"))
	}))
	defer upstream.Close()
	relay, _ := startRelay(t)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	for _, tc := range []struct{ accept, want, encoding string }{
		{"", `accept-encoding=""`, ""},
		{"gzip", "not really gzip", "gzip"},
	} {
		req := request(t, http.MethodGet, relay.URL, "/files", portOf(t, upstream.URL), nil)
		if tc.accept != "" {
			req.Header.Set("Accept-Encoding", tc.accept)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != tc.want || resp.Header.Get("Content-Encoding") != tc.encoding {
			t.Errorf("Accept-Encoding %q: got %q (Content-Encoding %q), want %q (%q)",
				tc.accept, body, resp.Header.Get("Content-Encoding"), tc.want, tc.encoding)
		}
	}
}

// Kept connections belong to one sandbox: a sandbox that gets the address
// of a killed one never receives a connection kept from the old one (its
// kernel would reset it, failing the first call, a POST, unretried), while
// calls to one sandbox reuse theirs.
func TestConnectionsKeptPerSandbox(t *testing.T) {
	var conns atomic.Int32
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("ok"))
	}))
	upstream.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	upstream.Start()
	defer upstream.Close()
	relay, res := startRelay(t)
	const other = "sbx00000000000second"
	res.set(other, Sandbox{Address: "127.0.0.1"}) // the same address
	post := func(id string) {
		t.Helper()
		req := request(t, http.MethodPost, relay.URL, "/process.Process/Start", portOf(t, upstream.URL), strings.NewReader("{}"))
		req.Header.Set(routing.HeaderSandboxID, id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST for %s: %d", id, resp.StatusCode)
		}
	}
	post(sandboxID)
	post(sandboxID)
	if n := conns.Load(); n != 1 {
		t.Fatalf("two calls to one sandbox opened %d connections, want 1 (kept)", n)
	}
	post(other)
	if n := conns.Load(); n != 2 {
		t.Fatalf("a call to another sandbox at the same address opened %d connections in all, want a new one (2)", n)
	}
}

// The response streams: the client reads the first chunk while the sandbox
// has not finished writing. The request streams too: a 16 MB chunked body
// arrives whole.
func TestStreams(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			n, err := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d %v", n, err)
			return
		}
		fmt.Fprint(w, "first\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "second\n")
	}))
	defer upstream.Close()
	defer close(release)
	relay, _ := startRelay(t)
	port := portOf(t, upstream.URL)

	resp, err := http.DefaultClient.Do(request(t, http.MethodGet, relay.URL, "/stream", port, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk = %q, %v; want it before the sandbox finishes", line, err)
	}

	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 1<<20)
		for range 16 {
			_, _ = rand.Read(buf)
			if _, err := pw.Write(buf); err != nil {
				return
			}
		}
		pw.Close()
	}()
	resp2, err := http.DefaultClient.Do(request(t, http.MethodPost, relay.URL, "/upload", port, pr))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	if string(body) != strconv.Itoa(16<<20)+" <nil>" {
		t.Fatalf("upload = %q, want 16 MiB received", body)
	}
}

// An upgraded connection (as WebSocket uses) is relayed both ways.
func TestUpgrade(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		rw.Flush()
		_, _ = io.Copy(conn, rw) // echo until the client closes
	}))
	defer upstream.Close()
	relay, _ := startRelay(t)

	conn, err := net.Dial("tcp", strings.TrimPrefix(relay.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n%s: %s\r\n%s: %s\r\n\r\n",
		routing.HeaderSandboxID, sandboxID, routing.HeaderSandboxPort, portOf(t, upstream.URL))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // a 101 has no body; the connection carries on
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade = %d, want 101", resp.StatusCode)
	}
	for _, msg := range []string{"ping\n", "pong\n"} {
		fmt.Fprint(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo = %q, %v; want %q", got, err, msg)
		}
	}
}

func TestRefusals(t *testing.T) {
	relay, res := startRelay(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := portOf(t, "http://"+closed.Addr().String())
	closed.Close()

	for _, tc := range []struct {
		name      string
		path      string
		headers   map[string]string
		status    int
		body      string
		noResolve bool
	}{
		{"envd /init", "/init", map[string]string{routing.HeaderSandboxID: sandboxID, routing.HeaderSandboxPort: "49983"}, 404, "404 page not found", true},
		{"envd /upgrade", "/upgrade", map[string]string{routing.HeaderSandboxID: sandboxID, routing.HeaderSandboxPort: "49983"}, 404, "404 page not found", true},
		{"missing port header", "/", map[string]string{routing.HeaderSandboxID: sandboxID}, 400, "missing header", true},
		{"no target", "/", nil, 400, "names no sandbox", true},
		{"unknown sandbox", "/", map[string]string{routing.HeaderSandboxID: "gone", routing.HeaderSandboxPort: "49983"}, 502, "The sandbox was not found", false},
		{"port not listening", "/", map[string]string{routing.HeaderSandboxID: sandboxID, routing.HeaderSandboxPort: deadPort}, 502, "The sandbox is running but port is not open", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := res.calls.Load()
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, relay.URL+tc.path, strings.NewReader("{}"))
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.body) || !json.Valid(body) {
				t.Fatalf("= %d %q, want %d with %q in JSON", resp.StatusCode, body, tc.status, tc.body)
			}
			if tc.noResolve && res.calls.Load() != before {
				t.Fatal("the resolver was asked about a refused request")
			}
		})
	}
}

// A request body and its response stream at once, in lockstep: the client
// sends each chunk only after the sandbox's echo of the one before came
// back. The relay must read the body while it writes the response (HTTP/1.1
// full duplex); Go's server otherwise discards and closes the rest of the
// body when the response starts, which deadlocks this exchange and, in the
// common case of a body fully sent but not yet seen to end, made the relay
// cut the sandbox's answer midway (the SDK's "terminated").
func TestStreamsBothWays(t *testing.T) {
	const chunk, chunks = 32 << 10, 20
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			t.Errorf("full duplex: %v", err)
		}
		buf := make([]byte, chunk)
		for {
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				if err != io.EOF {
					t.Errorf("sandbox read: %v", err)
				}
				fmt.Fprint(w, "end")
				return
			}
			if _, err := w.Write(buf); err != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
		}
	}))
	defer upstream.Close()
	relay, _ := startRelay(t)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	req := request(t, http.MethodPost, relay.URL, "/echo", portOf(t, upstream.URL), pr).WithContext(ctx)
	echoed := make(chan struct{})
	go func() {
		for i := range chunks {
			if _, err := pw.Write(bytes.Repeat([]byte{byte(i)}, chunk)); err != nil {
				return
			}
			select {
			case <-echoed:
			case <-ctx.Done():
				_ = pw.CloseWithError(ctx.Err())
				return
			}
		}
		_ = pw.Close()
	}()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer while the body is still being sent: %v", err)
	}
	defer resp.Body.Close()
	buf := make([]byte, chunk)
	for i := range chunks {
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatalf("echo of chunk %d: %v", i, err)
		}
		if !bytes.Equal(buf, bytes.Repeat([]byte{byte(i)}, chunk)) {
			t.Fatalf("chunk %d came back different", i)
		}
		echoed <- struct{}{}
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "end" {
		t.Fatalf("after the last chunk: %q, %v; want the sandbox's \"end\"", rest, err)
	}
}

// syncBuffer is a bytes.Buffer that the servers' goroutines may log to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// An answer the sandbox cuts midway is a warning naming the sandbox and
// port; a client that leaves midway is not.
func TestCutAnswerLogged(t *testing.T) {
	var logs syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cut" {
			// Promise 1000 bytes, send 100, and drop the connection.
			w.Header().Set("Content-Length", "1000")
			_, _ = w.Write(make([]byte, 100))
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		for { // /endless: until the client leaves
			if _, err := w.Write(make([]byte, 4096)); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
	}))
	defer upstream.Close()
	relay, _ := startRelay(t)
	port := portOf(t, upstream.URL)

	resp, err := http.DefaultClient.Do(request(t, http.MethodGet, relay.URL, "/cut", port, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("a cut answer read whole")
	}
	resp.Body.Close()
	want := `msg="answer from sandbox ended early" sandbox=` + sandboxID + " port=" + port
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log:\n%s", want, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	ctx, cancel := context.WithCancel(t.Context())
	resp, err = http.DefaultClient.Do(request(t, http.MethodGet, relay.URL, "/endless", port, nil).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 8192)); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	time.Sleep(200 * time.Millisecond) // time for a wrong warning to appear
	if n := strings.Count(logs.String(), "ended early"); n != 1 {
		t.Errorf("%d warnings after a client left; want only the cut answer's:\n%s", n, logs.String())
	}
}

// A request whose body is still coming when the relay finds the sandbox's
// port closed gets the 502, and so does the next request on the same
// connection: the relay read bodies full duplex, and Go's server then read
// the next request beside its own read of the unread body, and panicked
// ("invalid concurrent Body.Read call"). The answer names no address.
func TestClosedPortWithABody(t *testing.T) {
	relay, _ := startRelay(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := portOf(t, "http://"+closed.Addr().String())
	closed.Close()
	client := &http.Client{Transport: &http.Transport{}} // one kept connection
	defer client.CloseIdleConnections()
	for i := range 6 {
		body, w := io.Pipe()
		go func() {
			for range 5 {
				if _, err := w.Write(bytes.Repeat([]byte("x"), 1000)); err != nil {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			_ = w.Close()
		}()
		req := request(t, http.MethodPost, relay.URL, "/upload", deadPort, body)
		if i%2 == 1 {
			req.Header.Set("Expect", "100-continue")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || !json.Valid(got) || strings.Contains(string(got), "127.0.0.1") {
			t.Fatalf("request %d = %d %q, want e2b's 502 naming no address", i, resp.StatusCode, got)
		}
	}
}

// A sandbox created with e2b's maskRequestHost gets requests for its ports
// with that Host, "${PORT}" replaced by the port, and the public one in
// X-Forwarded-Host.
func TestMaskRequestHost(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s forwarded=%s", r.Host, r.Header.Get("X-Forwarded-Host"))
	}))
	defer upstream.Close()
	relay, res := startRelay(t)
	port := portOf(t, upstream.URL)
	public := port + "-" + sandboxID + ".sandbox.example.com"
	get := func() string {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, relay.URL+"/", nil)
		req.Host = public
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got, want := get(), "host="+public+" forwarded="+public; got != want {
		t.Errorf("unmasked: %q, want %q", got, want)
	}
	res.set(sandboxID, Sandbox{Address: "127.0.0.1", MaskRequestHost: "custom-host.example.com:${PORT}"})
	if got, want := get(), "host=custom-host.example.com:"+port+" forwarded="+public; got != want {
		t.Errorf("masked: %q, want %q", got, want)
	}
}

// The envd proxy in front of the relay sets X-Forwarded-For, -Host and
// -Proto for the client's request; they reach the sandbox's app as it sent
// them, so an app behind https sees https and the client's address, not
// the proxy's hop (http, the proxy's address). A request that comes
// without them gets this hop's.
func TestForwardedHeadersPassThrough(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "for=%q host=%q proto=%q", r.Header.Values("X-Forwarded-For"), r.Header.Values("X-Forwarded-Host"),
			r.Header.Values("X-Forwarded-Proto"))
	}))
	defer upstream.Close()
	relay, res := startRelay(t)
	port := portOf(t, upstream.URL)
	public := port + "-" + sandboxID + ".sandbox.example.com"
	get := func(forwarded map[string]string) string {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, relay.URL+"/", nil)
		req.Host = public
		for k, v := range forwarded {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	fromProxy := map[string]string{
		"X-Forwarded-For":   "203.0.113.7, 198.51.100.2",
		"X-Forwarded-Host":  "app.example.com", // a load balancer's in front of the proxy
		"X-Forwarded-Proto": "https",
	}
	want := fmt.Sprintf("for=%q host=%q proto=%q", []string{"203.0.113.7, 198.51.100.2"}, []string{"app.example.com"}, []string{"https"})
	if got := get(fromProxy); got != want {
		t.Errorf("through the proxy: %s, want %s", got, want)
	}
	if got, want := get(nil), fmt.Sprintf("for=%q host=%q proto=%q", []string{"127.0.0.1"}, []string{public}, []string{"http"}); got != want {
		t.Errorf("without the proxy's headers: %s, want this hop's %s", got, want)
	}
	// A masked Host changes the Host, not what the proxy forwarded.
	res.set(sandboxID, Sandbox{Address: "127.0.0.1", MaskRequestHost: "custom-host.example.com:${PORT}"})
	if got := get(fromProxy); got != want {
		t.Errorf("masked, through the proxy: %s, want %s", got, want)
	}
}

// The query reaches the sandbox's app as the client sent it, with the pairs
// Go's parser would drop (';', a bad escape).
func TestRawQueryPassesThrough(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.URL.RawQuery)
	}))
	defer upstream.Close()
	relay, _ := startRelay(t)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, relay.URL+"/p?a=1;b=2&q=100%", nil)
	req.Host = portOf(t, upstream.URL) + "-" + sandboxID + ".sandbox.example.com"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "a=1;b=2&q=100%" {
		t.Fatalf("the sandbox got the query %q, want it as sent", body)
	}
}
