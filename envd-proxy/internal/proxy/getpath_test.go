package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The GET path (getpath.go, on with SpliceAbove): large bodies of known
// length are spliced, everything else is read as http.Transport would, and
// connections are reused only after a complete exchange.

var (
	// splicing is a harness whose proxy splices bodies above 1 MiB.
	splicing = harnessOptions{transport: TransportOptions{SpliceAbove: 1 << 20}}
	// copying takes the GET path but splices no body of these tests.
	copying = harnessOptions{transport: TransportOptions{SpliceAbove: 1 << 40}}
)

func (h *harness) getPath() *getPath { return h.proxy.rp.Transport.(*Transport).get }

// idle is how many idle connections the GET path holds.
func (g *getPath) idleConns() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, conns := range g.idle {
		n += len(conns)
	}
	return n
}

// eventually fails the test if cond does not hold within a minute (the
// bound only turns a hang into a failure).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// sized answers body with its Content-Length, as envd's GET /files does.
func sized(body []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
}

// download GETs url through client and returns the body's digest and
// length, and the response's protocol and Content-Length, failing the test
// on any error.
func download(t *testing.T, client *http.Client, url, id string) (digest [32]byte, n int64, proto int, length int64) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	hash := sha256.New()
	n, err = io.Copy(hash, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d after %d bytes, %v", url, resp.StatusCode, n, err)
	}
	return [32]byte(hash.Sum(nil)), n, resp.ProtoMajor, resp.ContentLength
}

// The tests of streaming, cuts, logs and routing, again with the GET path
// on: it must behave as http.Transport does.
func TestEarlierTestsOnTheGETPath(t *testing.T) {
	harnessSpliceAbove = splicing.transport.SpliceAbove
	t.Cleanup(func() { harnessSpliceAbove = 0 })
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"ForwardsHeadersAndNormalizesRouting", TestForwardsHeadersAndNormalizesRouting},
		{"UnreachableHostAnswers502", TestUnreachableHostAnswers502},
		{"TokenFallbackRouting", TestTokenFallbackRouting},
		{"LogsCarryNoTokens", TestLogsCarryNoTokens},
		{"StreamFlushesEachChunkAsItComes", TestStreamFlushesEachChunkAsItComes},
		{"WebSocketRoundTrip", TestWebSocketRoundTrip},
		{"TrailersPassThrough", TestTrailersPassThrough},
		{"StreamEndedMidwayByEitherSide", TestStreamEndedMidwayByEitherSide},
	} {
		t.Run(tc.name, tc.test)
	}
}

// A body above SpliceAbove reaches a plain HTTP/1.1 client byte for byte
// through splice, and an HTTP/2 client (TLS) through reads, as it does any
// client when the GET path only copies; the bytes are counted, and the one
// connection to sandboxd serves every download.
func TestLargeBodyArrivesByteExact(t *testing.T) {
	body := chunkOf(7, 8<<20+123)
	want := sha256.Sum256(body)
	a := newUpstream(t, "node-a", sized(body))
	h := newHarness(t, splicing, a)
	id := sandbox(t, "node-a")
	g := h.getPath()

	got, n, _, length := download(t, h.srv.Client(), h.srv.URL+"/files?path=%2Fbig", id)
	if got != want || n != int64(len(body)) || length != int64(len(body)) {
		t.Fatalf("HTTP/1.1: %d bytes (Content-Length %d), digest differs: %v", n, length, got != want)
	}
	if g.spliced.Load() != 1 {
		t.Fatalf("the body was not spliced (%d)", g.spliced.Load())
	}
	if from := testutil.ToFloat64(h.proxy.metrics.fromSandbox); from < float64(len(body)) {
		t.Errorf("bytes_total{from_sandbox} = %v after a %d-byte body", from, len(body))
	}
	eventually(t, "the connection goes back to the pool", func() bool { return g.idleConns() == 1 })

	h2 := httptest.NewUnstartedServer(h.proxy)
	h2.EnableHTTP2 = true
	h2.StartTLS()
	defer h2.Close()
	got, n, proto, _ := download(t, h2.Client(), h2.URL+"/files?path=%2Fbig", id)
	if proto != 2 || got != want || n != int64(len(body)) {
		t.Fatalf("HTTP/%d: %d bytes, digest differs: %v", proto, n, got != want)
	}
	if g.spliced.Load() != 1 {
		t.Error("a body to an HTTP/2 client was handed to splice")
	}
	if a.accepts.Load() != 1 {
		t.Errorf("sandboxd accepted %d connections for two sequential downloads, want 1", a.accepts.Load())
	}

	b := newUpstream(t, "node-b", sized(body))
	h = newHarness(t, copying, b)
	got, n, _, length = download(t, h.srv.Client(), h.srv.URL+"/files?path=%2Fbig", sandbox(t, "node-b"))
	if got != want || n != int64(len(body)) || length != int64(len(body)) {
		t.Fatalf("copied: %d bytes (Content-Length %d), digest differs: %v", n, length, got != want)
	}
	if h.getPath().spliced.Load() != 0 {
		t.Fatal("a body below SpliceAbove was spliced")
	}
}

// After a complete exchange, whatever the body's kind, the next request
// goes on the same connection.
func TestConnectionReusedAfterFullRead(t *testing.T) {
	large, small := chunkOf(1, 3<<20), []byte("small body")
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("kind") {
		case "large":
			sized(large).ServeHTTP(w, r)
		case "small":
			sized(small).ServeHTTP(w, r)
		case "chunked":
			for i := range 4 {
				_, _ = w.Write(chunkOf(i, 100<<10))
				_ = http.NewResponseController(w).Flush()
			}
		case "empty":
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	h := newHarness(t, splicing, a)
	id := sandbox(t, "node-a")
	g := h.getPath()
	for i, kind := range []string{"large", "small", "chunked", "empty", "large"} {
		resp, body := h.do(h.request(http.MethodGet, "/files?kind="+kind, id, "49983", nil))
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s: %d %q", kind, resp.StatusCode, body)
		}
		eventually(t, kind+": the connection goes back to the pool", func() bool { return g.idleConns() == 1 })
		if a.accepts.Load() != 1 {
			t.Fatalf("request %d (%s) opened connection %d to sandboxd", i, kind, a.accepts.Load())
		}
	}
	if g.spliced.Load() != 2 {
		t.Errorf("%d bodies spliced, want the 2 large ones", g.spliced.Load())
	}
}

// With splicing on, small bodies, a body of exactly SpliceAbove, chunked
// bodies and the answers to POSTs take the copy path, byte for byte.
func TestSmallAndChunkedBodiesAreCopied(t *testing.T) {
	bodies := map[string][]byte{
		"small":     chunkOf(2, 1000),
		"threshold": chunkOf(3, 1<<20),
		"chunked":   chunkOf(4, 4<<20),
		"post":      chunkOf(5, 4<<20),
	}
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := r.URL.Query().Get("kind")
		if kind == "chunked" {
			body := bodies[kind]
			for len(body) > 0 {
				n := min(len(body), 300<<10)
				_, _ = w.Write(body[:n])
				_ = http.NewResponseController(w).Flush()
				body = body[n:]
			}
			return
		}
		sized(bodies[kind]).ServeHTTP(w, r)
	}))
	h := newHarness(t, splicing, a)
	id := sandbox(t, "node-a")
	for kind, want := range bodies {
		method := http.MethodGet
		if kind == "post" {
			method = http.MethodPost
		}
		resp, got := h.do(h.request(method, "/files?kind="+kind, id, "49983", strings.NewReader("")))
		if resp.StatusCode != http.StatusOK || got != string(want) {
			t.Errorf("%s: %d, %d bytes, equal %v", kind, resp.StatusCode, len(got), got == string(want))
		}
	}
	if n := h.getPath().spliced.Load(); n != 0 {
		t.Errorf("%d bodies spliced, want none", n)
	}
}

// A client that leaves in the middle of a large body (spliced or copied),
// or before the answer's headers, ends the exchange with sandboxd: the
// connection is closed, not pooled, and no warning is logged. (TestMain
// checks that no goroutine is left.)
func TestClientLeavingClosesTheUpstreamConnection(t *testing.T) {
	t.Run("spliced", func(t *testing.T) { testClientLeaving(t, splicing, 1) })
	t.Run("copied", func(t *testing.T) { testClientLeaving(t, copying, 0) })
}

func testClientLeaving(t *testing.T, opts harnessOptions, wantSpliced int64) {
	const size = 1 << 30 // more than the socket buffers on the way hold
	block := chunkOf(6, 1<<20)
	handlerDone := make(chan error, 2)
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("kind") == "silent" {
			<-r.Context().Done() // the proxy closed the connection
			handlerDone <- r.Context().Err()
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for sent := 0; sent < size; sent += len(block) {
			if _, err := w.Write(block); err != nil {
				handlerDone <- err
				return
			}
		}
		handlerDone <- nil
	}))
	h := newHarness(t, opts, a)
	id := sandbox(t, "node-a")
	g := h.getPath()

	resp, err := h.srv.Client().Do(h.request(http.MethodGet, "/files?kind=big", id, "49983", nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 3<<20)); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	h.srv.Client().CloseIdleConnections()
	done := make(chan struct{})
	go func() {
		if err := <-handlerDone; err == nil {
			t.Error("sandboxd sent the whole body to a client that had left")
		}
		close(done)
	}()
	hangGuard(t, "sandboxd sees the client leave", done)
	eventually(t, "the connection to sandboxd closes", func() bool { return a.open() == 0 })
	if g.spliced.Load() != wantSpliced || g.idleConns() != 0 {
		t.Fatalf("spliced %d, idle connections %d", g.spliced.Load(), g.idleConns())
	}
	h.waitCounted("header", "200", 1)

	ctx, cancel := context.WithCancel(t.Context())
	req := h.request(http.MethodGet, "/files?kind=silent", id, "49983", nil).WithContext(ctx)
	errc := make(chan error, 1)
	go func() {
		resp, err := h.srv.Client().Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "the silent request reaches sandboxd", func() bool { return len(a.requests()) == 2 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled request got an answer")
	}
	done = make(chan struct{})
	go func() {
		if err := <-handlerDone; err == nil {
			t.Error("sandboxd's silent handler ended without the proxy leaving")
		}
		close(done)
	}()
	hangGuard(t, "sandboxd sees the client leave before the headers", done)
	eventually(t, "the connection to sandboxd closes", func() bool { return a.open() == 0 })
	if g.idleConns() != 0 {
		t.Fatalf("idle connections %d", g.idleConns())
	}
	h.waitCounted("header", "0", 1)
	if logs := h.logs.String(); strings.Contains(logs, `"level":"WARN"`) {
		t.Fatalf("a client leaving logged a warning:\n%s", logs)
	}
}

// A body that sandboxd ends before its Content-Length reaches the client
// as an error, never as a complete body, whether spliced or copied; the
// proxy logs it, and the connection is not reused.
func TestBodyCutShortIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name           string
		opts           harnessOptions
		declared, sent int
		spliced        int64
	}{
		{"spliced", splicing, 8 << 20, 3 << 20, 1},
		{"copied", copying, 8 << 20, 3 << 20, 0},
		{"copied below SpliceAbove", splicing, 512 << 10, 100 << 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				defer conn.Close()
				fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", tc.declared)
				_, _ = brw.Write(chunkOf(8, tc.sent))
				_ = brw.Flush()
			}))
			h := newHarness(t, tc.opts, a)
			resp, err := h.srv.Client().Do(h.request(http.MethodGet, "/files?path=%2Fcut", sandbox(t, "node-a"), "49983", nil))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err == nil || len(got) >= tc.declared {
				t.Fatalf("a body cut at %d of %d bytes reached the client as %d bytes, %v", tc.sent, tc.declared, len(got), err)
			}
			if !bytes.Equal(got, chunkOf(8, tc.sent)[:len(got)]) {
				t.Fatal("the bytes before the cut differ")
			}
			h.waitCounted("header", "200", 1)
			if logs := h.logs.String(); !strings.Contains(logs, "response from sandboxd ended early") {
				t.Fatalf("the cut was not logged:\n%s", logs)
			}
			if g := h.getPath(); g.spliced.Load() != tc.spliced || g.idleConns() != 0 {
				t.Fatalf("spliced %d, idle connections %d", g.spliced.Load(), g.idleConns())
			}
		})
	}
}

// A pooled connection that sandboxd closed while it was idle costs the next
// GET nothing: it goes on a new connection.
func TestStaleIdleConnectionIsRetried(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	h := newHarness(t, splicing, a)
	id := sandbox(t, "node-a")
	if resp, body := h.do(h.request(http.MethodGet, "/files", id, "49983", nil)); body != "ok from node-a" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	eventually(t, "the connection goes back to the pool", func() bool { return h.getPath().idleConns() == 1 })
	a.CloseClientConnections()
	eventually(t, "sandboxd closes it", func() bool { return a.open() == 0 })
	if resp, body := h.do(h.request(http.MethodGet, "/files", id, "49983", nil)); resp.StatusCode != http.StatusOK || body != "ok from node-a" {
		t.Fatalf("after sandboxd closed the idle connection: %d %q", resp.StatusCode, body)
	}
	if a.accepts.Load() != 2 {
		t.Fatalf("sandboxd accepted %d connections, want 2", a.accepts.Load())
	}
}

// Informational answers (103 Early Hints) to a GET reach the client before
// the final one, as through http.Transport.
func TestInformationalResponsesPassThrough(t *testing.T) {
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		_, _ = io.WriteString(w, "final")
	}))
	h := newHarness(t, splicing, a)
	var got []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
		got = append(got, strconv.Itoa(code)+" "+hdr.Get("Link"))
		return nil
	}}
	req := h.request(http.MethodGet, "/", sandbox(t, "node-a"), "8080", nil)
	resp, body := h.do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if resp.StatusCode != http.StatusOK || body != "final" || len(got) != 1 || got[0] != "103 </app.css>; rel=preload" {
		t.Fatalf("%d %q, informational %q", resp.StatusCode, body, got)
	}
}

// A GET reaches sandboxd byte for byte as it did through http.Transport.
func TestGETReachesSandboxdAsThroughHTTPTransport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	heads := make(chan string, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // a raw sandboxd: records each request's head, answers "ok"
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					var head strings.Builder
					for {
						line, err := br.ReadString('\n')
						if err != nil {
							return
						}
						head.WriteString(line)
						if line == "\r\n" {
							break
						}
					}
					heads <- head.String()
					if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			}()
		}
	}()
	id := sandbox(t, "node-a")
	send := func(opts TransportOptions) []string {
		h := newHarness(t, harnessOptions{transport: opts})
		h.addNode("node-a", ln.Addr().String())
		h.refresh()
		var got []string
		for _, hdr := range []http.Header{
			{"User-Agent": {""}},
			{"User-Agent": {"e2b-js-sdk/2.51.0"}, "X-Access-Token": {"tok"}, "Te": {"trailers"}, "Connection": {"keep-alive, X-Hop"},
				"X-Hop": {"dropped"}, "Accept-Encoding": {"gzip"}, "Range": {"bytes=0-9"}, "X-Forwarded-For": {"203.0.113.7"},
				"Skiff_node_token": {"forged"}, "X-Multi": {"a", "b"}},
		} {
			req := h.request(http.MethodGet, "/files?path=%2Fa%20b&username=user", id, "49983", nil)
			req.Host = "sandbox.example"
			for k, v := range hdr {
				req.Header[k] = v
			}
			if resp, body := h.do(req); resp.StatusCode != http.StatusOK || body != "ok" {
				t.Fatalf("%d %q", resp.StatusCode, body)
			}
			got = append(got, <-heads)
		}
		return got
	}
	viaGetPath, viaTransport := send(splicing.transport), send(TransportOptions{})
	for i := range viaGetPath {
		if viaGetPath[i] != viaTransport[i] {
			t.Errorf("request %d reached sandboxd as\n%s\nnot as through http.Transport:\n%s", i, viaGetPath[i], viaTransport[i])
		}
	}
}
