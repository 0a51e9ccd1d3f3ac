package idlebody_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/idlebody"
)

// serve runs a server with a whole-request read timeout of readTimeout
// whose handler proxies to an upstream that reads the body whole and
// answers its length, the body under idle.
func serve(t *testing.T, readTimeout, idle time.Duration) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, n)
	}))
	t.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadTimeout: readTimeout, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := idlebody.Watch(w, r, idle)
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				if body != nil && pr.Out.Body != nil {
					pr.Out.Body = body.Wrap(pr.Out.Body)
				}
			},
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				if body.TimedOut() {
					w.WriteHeader(http.StatusRequestTimeout)
					return
				}
				w.WriteHeader(http.StatusBadGateway)
			},
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// upload sends a body of parts, pause apart, and returns the answer's
// status and body.
func upload(t *testing.T, addr string, parts []string, pause time.Duration) (int, string) {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		for i, p := range parts {
			if i > 0 {
				time.Sleep(pause)
			}
			if _, err := io.WriteString(pw, p); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/", pr)
	req.ContentLength = int64(len(strings.Join(parts, "")))
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A body that keeps moving passes the server's whole-request read timeout;
// one that stalls for the idle time is cut.
func TestUploadLongerThanTheReadTimeout(t *testing.T) {
	addr := serve(t, 300*time.Millisecond, 500*time.Millisecond)
	parts := []string{"aaaa", "bbbb", "cccc", "dddd", "eeee", "ffff", "gggg", "hhhh"}
	if code, body := upload(t, addr, parts, 100*time.Millisecond); code != http.StatusCreated || body != "32" {
		t.Fatalf("a body sent over 700 ms, moving every 100 ms: %d %q; want 201 and its 32 bytes", code, body)
	}
	if code, _ := upload(t, addr, []string{"aaaa", "bbbb"}, 1500*time.Millisecond); code != http.StatusRequestTimeout {
		t.Fatalf("a body that stalled for 1.5 s under an idle time of 500 ms: %d; want 408", code)
	}
}

// Without a body, or with no idle time, Watch leaves the server's bounds.
func TestWatchNothing(t *testing.T) {
	w := httptest.NewRecorder()
	if b := idlebody.Watch(w, httptest.NewRequest(http.MethodGet, "/", nil), time.Second); b != nil {
		t.Error("a request without a body was watched")
	}
	if b := idlebody.Watch(w, httptest.NewRequest(http.MethodPut, "/", strings.NewReader("x")), 0); b != nil {
		t.Error("a body was watched with no idle time")
	}
}
