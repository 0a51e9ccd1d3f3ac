package fleet_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
)

// A volume's content goes to its host with the node's token and the team,
// an upload as long as its body keeps moving, past the apiserver's
// whole-request read timeout; a body that stalls for the idle time is cut
// (408); a volume deleted since its token was made answers 410.
func TestServeVolumeContent(t *testing.T) {
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/skiff/v1/volumes/vol-data/content/file" || r.URL.Query().Get("path") != "/a" ||
			r.Header.Get("Authorization") != "Bearer token-of-node-a" || r.Header.Get("Skiff-Volume-Team") != "team1" {
			http.Error(w, fmt.Sprintf("wrong request: %s %v", r.URL, r.Header), http.StatusTeapot)
			return
		}
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, n)
	}))
	defer host.Close()
	a := newFakeNode("node-a", "base")
	a.addr, a.volumes = strings.TrimPrefix(host.URL, "http://"), []string{"data"}
	h := newHarnessWith(t, func(c *fleet.Config) {
		c.Tokens = func(node string) string { return "token-of-" + node }
		c.BodyIdleTimeout = 500 * time.Millisecond
	}, a)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadTimeout: 300 * time.Millisecond, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.b.ServeVolumeContent(w, r, "team1", strings.TrimPrefix(r.URL.Path, "/"), "file")
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	// put sends parts, pause apart, as one body.
	put := func(id string, parts int, pause time.Duration) (int, string) {
		pr, pw := io.Pipe()
		go func() {
			for i := range parts {
				if i > 0 {
					time.Sleep(pause)
				}
				if _, err := io.WriteString(pw, "abcd"); err != nil {
					return
				}
			}
			_ = pw.Close()
		}()
		req, _ := http.NewRequest(http.MethodPut, "http://"+ln.Addr().String()+"/"+id+"?path=/a", pr)
		req.ContentLength = int64(4 * parts)
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := put("vol-data", 8, 100*time.Millisecond); code != http.StatusCreated || body != "32" {
		t.Errorf("an upload moving every 100 ms for 700 ms, read timeout 300 ms: %d %q; want 201 and its 32 bytes", code, body)
	}
	if code, body := put("vol-data", 2, 1500*time.Millisecond); code != http.StatusRequestTimeout || !strings.Contains(body, "sent nothing for 500ms") {
		t.Errorf("an upload that stalled for 1.5 s, idle timeout 500 ms: %d %q; want 408", code, body)
	}
	if code, body := put("vol-gone", 1, 0); code != http.StatusGone {
		t.Errorf("content of a deleted volume: %d %q; want 410", code, body)
	}
}
