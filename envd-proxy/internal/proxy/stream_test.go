package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha1" //nolint:gosec // RFC 6455 defines Sec-WebSocket-Accept with SHA-1.
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skiff-dev/skiff/wire"
)

// hangGuard fails the test if done does not close in time: a proxy that
// buffers would deadlock the lockstep tests below, and this turns that hang
// into a failure. It is not a speed assertion.
func hangGuard(t *testing.T, what string, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s: no progress in 2 minutes (buffered?)", what)
	}
}

// sandboxd sends a chunk, then waits until the client has read it before
// it sends the next: any buffering in the proxy deadlocks this. Both a
// Connect server stream (chunked) and a download of known length (envd's
// GET /files), which ReverseProxy would otherwise buffer.
func TestStreamFlushesEachChunkAsItComes(t *testing.T) {
	const chunks = 5
	for _, tc := range []struct {
		name, method, path string
		known              bool // Content-Length set
	}{
		{"connect stream", http.MethodPost, "/process.Process/Start", false},
		{"download of known length", http.MethodGet, "/files?path=%2Flog", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := make(chan struct{})
			a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/connect+json")
				if tc.known {
					w.Header().Set("Content-Length", strconv.Itoa(chunks*len("chunk-0\n")))
				}
				for i := range chunks {
					fmt.Fprintf(w, "chunk-%d\n", i)
					if err := http.NewResponseController(w).Flush(); err != nil {
						t.Errorf("flush: %v", err)
						return
					}
					select {
					case <-read:
					case <-r.Context().Done():
						return
					}
				}
			}))
			h := newHarness(t, harnessOptions{}, a)
			req := h.request(tc.method, tc.path, sandbox(t, "node-a"), "49983", nil)
			resp, err := h.srv.Client().Do(req) //nolint:bodyclose // closed by the defer below; read in a goroutine.
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				br := bufio.NewReader(resp.Body)
				for i := range chunks {
					line, err := br.ReadString('\n')
					if err != nil || line != fmt.Sprintf("chunk-%d\n", i) {
						t.Errorf("chunk %d: %q, %v", i, line, err)
						return
					}
					read <- struct{}{}
				}
				if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
					t.Errorf("after the last chunk: %q, %v", rest, err)
				}
			}()
			hangGuard(t, tc.name, done)
		})
	}
}

// A WebSocket to a user's service in the sandbox: the upgrade passes
// through, and frames go both ways on the spliced connection.
func TestWebSocketRoundTrip(t *testing.T) {
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || r.Header.Get(wire.NodeTokenHeader) != nodeToken {
			http.Error(w, "not a websocket", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			wsAccept(r.Header.Get("Sec-WebSocket-Key")))
		if err := brw.Flush(); err != nil {
			return
		}
		for {
			msg, err := wsRead(brw.Reader)
			if err != nil {
				return // the client closed
			}
			if err := wsWrite(conn, append([]byte("echo: "), msg...), false); err != nil {
				return
			}
		}
	}))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")

	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: 8080-%s.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", id, key)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // empty: after a 101 the connection is the stream
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(key) {
		t.Fatalf("upgrade answered %d %v", resp.StatusCode, resp.Header)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, msg := range []string{"hello", strings.Repeat("x", 300), strings.Repeat("y", 70000)} {
			if err := wsWrite(conn, []byte(msg), true); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
			got, err := wsRead(br)
			if err != nil || string(got) != "echo: "+msg {
				t.Errorf("message %d: %d bytes, %v", i, len(got), err)
				return
			}
		}
	}()
	hangGuard(t, "websocket", done)
	if n := testutil.ToFloat64(h.proxy.metrics.openUpgrade); n != 1 {
		t.Errorf("open_streams{kind=upgrade} = %v with one WebSocket open", n)
	}
	if got := a.last(t); got.Header.Get("E2b-Sandbox-Id") != id || got.Header.Get("E2b-Sandbox-Port") != "8080" {
		t.Errorf("the upgrade reached sandboxd as %q:%q", got.Header.Get("E2b-Sandbox-Id"), got.Header.Get("E2b-Sandbox-Port"))
	}
}

// 100 MB up and 100 MB down in one request, in lockstep: the client sends
// each MiB only after sandboxd's echo of the one before came back, so the
// proxy must stream both bodies at once without holding either.
func TestHundredMegabytesStreamBothWays(t *testing.T) {
	const chunk, chunks = 1 << 20, 100
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			t.Errorf("full duplex: %v", err)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		buf := make([]byte, chunk)
		for {
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Errorf("sandboxd read: %v", err)
				}
				return
			}
			if _, err := w.Write(buf); err != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
		}
	}))
	h := newHarness(t, harnessOptions{}, a)
	pr, pw := io.Pipe()
	req := h.request(http.MethodPost, "/files?path=%2Fbig", sandbox(t, "node-a"), "49983", pr)
	req.Header.Set("Content-Type", "application/octet-stream")
	echoed := make(chan struct{})
	go func() {
		for i := range chunks {
			if _, err := pw.Write(chunkOf(i, chunk)); err != nil {
				t.Errorf("client write %d: %v", i, err)
				return
			}
			select {
			case <-echoed:
			case <-t.Context().Done():
				return
			}
		}
		_ = pw.Close()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := h.srv.Client().Do(req)
		if err != nil {
			t.Errorf("do: %v", err)
			_ = pw.CloseWithError(err)
			return
		}
		defer resp.Body.Close()
		buf := make([]byte, chunk)
		for i := range chunks {
			if _, err := io.ReadFull(resp.Body, buf); err != nil {
				t.Errorf("client read %d: %v", i, err)
				_ = pw.CloseWithError(err)
				return
			}
			if !bytes.Equal(buf, chunkOf(i, chunk)) {
				t.Errorf("chunk %d came back different", i)
				_ = pw.CloseWithError(errors.New("mismatch"))
				return
			}
			echoed <- struct{}{}
		}
		if n, err := io.Copy(io.Discard, resp.Body); n != 0 || err != nil {
			t.Errorf("after the last chunk: %d bytes, %v", n, err)
		}
	}()
	hangGuard(t, "100 MB both ways", done)
}

// chunkOf is chunk i of a deterministic stream.
func chunkOf(i, size int) []byte {
	b := make([]byte, size)
	r := rand.NewChaCha8([32]byte{byte(i), byte(i >> 8)})
	_, _ = r.Read(b)
	return b
}

func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC11B85")) //nolint:gosec // RFC 6455.
	return base64.StdEncoding.EncodeToString(h[:])
}

// wsWrite writes one final text frame; a client masks it (RFC 6455 §5.3).
func wsWrite(w io.Writer, payload []byte, mask bool) error {
	hdr := []byte{0x81, 0}
	switch n := len(payload); {
	case n < 126:
		hdr[1] = byte(n)
	case n < 1<<16:
		hdr[1] = 126
		hdr = binary.BigEndian.AppendUint16(hdr, uint16(n))
	default:
		hdr[1] = 127
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	body := payload
	if mask {
		hdr[1] |= 0x80
		key := [4]byte{1, 2, 3, 4}
		hdr = append(hdr, key[:]...)
		body = make([]byte, len(payload))
		for i := range payload {
			body[i] = payload[i] ^ key[i%4]
		}
	}
	_, err := w.Write(append(hdr, body...))
	return err
}

// wsRead reads one frame's payload, unmasking it.
func wsRead(r *bufio.Reader) ([]byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := uint64(hdr[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var key [4]byte
	masked := hdr[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(r, key[:]); err != nil {
			return nil, err
		}
	}
	if n > 1<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, err
	}
	if masked {
		for i := range p {
			p[i] ^= key[i%4]
		}
	}
	return p, nil
}

// Trailers that sandboxd sends after a body reach the client.
func TestTrailersPassThrough(t *testing.T) {
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		_, _ = io.WriteString(w, strings.Repeat("body ", 10000))
		w.Header().Set("X-Checksum", "abc123")
	}))
	h := newHarness(t, harnessOptions{}, a)
	resp, err := h.srv.Client().Do(h.request(http.MethodGet, "/", sandbox(t, "node-a"), "8080", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || len(body) != 50000 || resp.Trailer.Get("X-Checksum") != "abc123" {
		t.Fatalf("%d bytes (%v), trailer %v", len(body), err, resp.Trailer)
	}
}

// A client that leaves in the middle of a stream (an SDK cancelling a
// command's output) ends the request to sandboxd, is counted, and logs no
// warning; sandboxd failing midway does log one.
func TestStreamEndedMidwayByEitherSide(t *testing.T) {
	upstreamGone := make(chan struct{})
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 100<<10))
		_ = http.NewResponseController(w).Flush()
		if r.URL.Path == "/die" {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close() // sandboxd's end of a chunked body, cut
			}
			return
		}
		<-r.Context().Done()
		close(upstreamGone)
	}))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")
	req := h.request(http.MethodPost, "/process.Process/Start", id, "49983", nil)
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close() // the client leaves
	h.srv.Client().CloseIdleConnections()
	done := make(chan struct{})
	go func() { <-upstreamGone; close(done) }()
	hangGuard(t, "sandboxd sees the client leave", done)
	h.waitCounted("header", "200", 1)
	if logs := h.logs.String(); strings.Contains(logs, `"level":"WARN"`) {
		t.Fatalf("a client leaving logged a warning:\n%s", logs)
	}

	resp, err = h.srv.Client().Do(h.request(http.MethodGet, "/die", id, "49983", nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err == nil {
		t.Fatal("a body cut by sandboxd reached the client as complete")
	}
	h.waitCounted("header", "200", 2)
	if logs := h.logs.String(); !strings.Contains(logs, "response from sandboxd ended early") {
		t.Fatalf("sandboxd failing midway was not logged:\n%s", logs)
	}
}
