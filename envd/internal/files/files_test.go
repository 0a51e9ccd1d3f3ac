package files

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/wire"
)

const testToken = "secret-token"

// newHandler returns a handler for a sandbox with token ("" for none) and a
// fixed clock.
func newHandler(t *testing.T, token string) (*handler, *state.Sandbox) {
	t.Helper()
	sb := state.New()
	if token != "" {
		sb.Apply(wire.EnvdInit{AccessToken: &token})
	}
	h := New(sb).(*handler)
	h.now = func() time.Time { return time.Unix(1_700_000_000, 0) }
	return h, sb
}

// do runs req against h and returns the recorded response.
func do(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// filesURL builds a /files URL with the query pairs kv.
func filesURL(route string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Add(kv[i], kv[i+1])
	}
	if len(q) == 0 {
		return route
	}
	return route + "?" + q.Encode()
}

// wantError checks an e2b HTTP error response.
func wantError(t *testing.T, rec *httptest.ResponseRecorder, status int, msgPart string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("error body %q: %v", rec.Body, err)
	}
	if e.Code != status || !strings.Contains(e.Message, msgPart) {
		t.Fatalf("error = %+v, want code %d and message containing %q", e, status, msgPart)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func owner(t *testing.T, p string) (uid, gid uint32) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

func gunzip(t *testing.T, b []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func gzipBytes(t *testing.T, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDownload(t *testing.T) {
	h, _ := newHandler(t, "")
	dir := t.TempDir()
	file := filepath.Join(dir, "hello world.txt")
	writeFile(t, file, "hello, envd")
	noExt := filepath.Join(dir, "README")
	writeFile(t, noExt, "plain words")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(file, mtime, mtime); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		method  string
		path    string
		headers map[string]string
		status  int
		body    string // for 2xx: the decoded body
		gzip    bool
		errPart string
		check   func(t *testing.T, rec *httptest.ResponseRecorder)
	}{
		{name: "plain", path: file, status: 200, body: "hello, envd", check: func(t *testing.T, rec *httptest.ResponseRecorder) {
			if got := rec.Header().Get("Content-Disposition"); got != `inline; filename="hello world.txt"` {
				t.Errorf("Content-Disposition = %q", got)
			}
			if got := rec.Header().Get("Content-Type"); !strings.HasPrefix(got, "text/plain") {
				t.Errorf("Content-Type = %q", got)
			}
			if got := rec.Header().Get("Content-Length"); got != "11" {
				t.Errorf("Content-Length = %q", got)
			}
		}},
		{name: "range", path: file, headers: map[string]string{"Range": "bytes=7-"}, status: 206, body: "envd"},
		{name: "range with gzip accepted stays identity", path: file, headers: map[string]string{"Range": "bytes=0-4", "Accept-Encoding": "gzip"}, status: 206, body: "hello"},
		{name: "if-modified-since", path: file, headers: map[string]string{"If-Modified-Since": mtime.UTC().Format(http.TimeFormat)}, status: 304},
		{name: "gzip", path: file, headers: map[string]string{"Accept-Encoding": "gzip, deflate"}, status: 200, body: "hello, envd", gzip: true, check: func(t *testing.T, rec *httptest.ResponseRecorder) {
			if got := rec.Header().Get("Vary"); got != "Accept-Encoding" {
				t.Errorf("Vary = %q", got)
			}
			if got := rec.Header().Get("Content-Length"); got != "" {
				t.Errorf("Content-Length = %q with gzip", got)
			}
		}},
		{name: "gzip q-values prefer identity", path: file, headers: map[string]string{"Accept-Encoding": "gzip;q=0.5, identity"}, status: 200, body: "hello, envd"},
		{name: "gzip, typed by its extension", path: file, headers: map[string]string{"Accept-Encoding": "gzip"}, status: 200, body: "hello, envd", gzip: true, check: func(t *testing.T, rec *httptest.ResponseRecorder) {
			if got := rec.Header().Get("Content-Type"); got != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type = %q", got)
			}
		}},
		{name: "gzip, no extension", path: noExt, headers: map[string]string{"Accept-Encoding": "gzip"}, status: 200, body: "plain words", gzip: true, check: func(t *testing.T, rec *httptest.ResponseRecorder) {
			if got := rec.Header().Get("Content-Type"); got != "application/octet-stream" {
				t.Errorf("Content-Type = %q, want e2b's application/octet-stream", got)
			}
		}},
		{name: "gzip if-modified-since", path: file, headers: map[string]string{"Accept-Encoding": "gzip", "If-Modified-Since": mtime.UTC().Format(http.TimeFormat)}, status: 304},
		{name: "gzip if-modified-since, changed since", path: noExt, headers: map[string]string{"Accept-Encoding": "gzip", "If-Modified-Since": mtime.Add(-time.Hour).UTC().Format(http.TimeFormat)}, status: 200, body: "plain words", gzip: true, check: func(t *testing.T, rec *httptest.ResponseRecorder) {
			if got := rec.Header().Get("Content-Type"); got != "application/octet-stream" {
				t.Errorf("Content-Type = %q, want e2b's application/octet-stream", got)
			}
		}},
		{name: "head gzip", method: http.MethodHead, path: file, headers: map[string]string{"Accept-Encoding": "gzip"}, status: 200, body: "", check: func(t *testing.T, rec *httptest.ResponseRecorder) {
			if rec.Body.Len() != 0 || rec.Header().Get("Content-Encoding") != "gzip" {
				t.Errorf("HEAD body %d bytes, encoding %q", rec.Body.Len(), rec.Header().Get("Content-Encoding"))
			}
		}},
		{name: "406 br only", path: file, headers: map[string]string{"Accept-Encoding": "br, identity;q=0"}, status: 406, errPart: "encoding"},
		{name: "406 star zero", path: file, headers: map[string]string{"Accept-Encoding": "br;q=1, *;q=0"}, status: 406, errPart: "encoding"},
		{name: "missing", path: filepath.Join(dir, "nope"), status: 404, errPart: fmt.Sprintf("path '%s' does not exist", filepath.Join(dir, "nope"))},
		{name: "under a file", path: filepath.Join(file, "x"), status: 404, errPart: "does not exist"},
		{name: "missing, its name repeated in the JSON", path: filepath.Join(dir, "q\"b\\c\x01\xff"), status: 404, errPart: `q"b\c` + "\x01"},
		{name: "directory", path: dir, status: 400, errPart: "is a directory"},
		{name: "fifo", path: fifo, status: 400, errPart: "not a regular file"},
		{name: "nul", path: "a\x00b", status: 400, errPart: "invalid path"},
		{name: "unknown user", path: file, headers: map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("no-such-user-x:"))}, status: 401, errPart: "invalid username: 'no-such-user-x'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req := httptest.NewRequest(method, filesURL("/files", "path", tc.path), nil)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := do(h, req)
			if tc.errPart != "" {
				wantError(t, rec, tc.status, tc.errPart)
				return
			}
			if rec.Code != tc.status {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tc.status, rec.Body)
			}
			body := rec.Body.String()
			if tc.gzip {
				if rec.Header().Get("Content-Encoding") != "gzip" {
					t.Fatalf("Content-Encoding = %q", rec.Header().Get("Content-Encoding"))
				}
				body = gunzip(t, rec.Body.Bytes())
			} else if rec.Header().Get("Content-Encoding") != "" && method == http.MethodGet {
				t.Fatalf("unexpected Content-Encoding %q", rec.Header().Get("Content-Encoding"))
			}
			if tc.status != 304 && body != tc.body {
				t.Fatalf("body = %q, want %q", body, tc.body)
			}
			if tc.check != nil {
				tc.check(t, rec)
			}
		})
	}
}

// A /proc or /sys file, whose size says 0 and which may not seek to its
// end, is read to its end, compressed or not, as e2b's envd reads it
// compressed (the SDKs ask for gzip).
func TestDownloadProcFiles(t *testing.T) {
	h, _ := newHandler(t, "")
	want, err := os.ReadFile("/proc/sys/kernel/ostype")
	if err != nil {
		t.Fatal(err)
	}
	// Its time of change says nothing of what it holds: none is sent, and
	// a conditional request or a range gets it whole.
	later := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	for _, tc := range []struct{ path, encoding, header, value, want string }{
		{"/proc/meminfo", "gzip", "", "", "MemTotal:"},
		{"/proc/meminfo", "", "", "", "MemTotal:"},
		{"/proc/meminfo", "gzip", "If-Modified-Since", later, "MemTotal:"},
		{"/proc/meminfo", "", "If-None-Match", `"x"`, "MemTotal:"},
		{"/proc/meminfo", "", "Range", "bytes=0-3", "MemTotal:"},
		{"/proc/sys/kernel/ostype", "gzip, deflate, br", "", "", string(want)},
		{"/proc/sys/kernel/ostype", "", "", "", string(want)},
		{"/proc/sys/kernel/ostype", "", "If-Modified-Since", later, string(want)},
	} {
		req := httptest.NewRequest(http.MethodGet, filesURL("/files", "path", tc.path), nil)
		if tc.encoding != "" {
			req.Header.Set("Accept-Encoding", tc.encoding)
		}
		if tc.header != "" {
			req.Header.Set(tc.header, tc.value)
		}
		rec := do(h, req)
		body := rec.Body.String()
		if rec.Header().Get("Content-Encoding") == "gzip" {
			body = gunzip(t, rec.Body.Bytes())
		}
		gzipped := tc.encoding != "" && tc.header != "Range"
		if rec.Code != http.StatusOK || !strings.Contains(body, tc.want) || gzipped != (rec.Header().Get("Content-Encoding") == "gzip") ||
			rec.Header().Get("Last-Modified") != "" || rec.Header().Get("Content-Type") != "application/octet-stream" {
			t.Errorf("GET %s (Accept-Encoding %q, %s %q) = %d %q, headers %v; want it whole", tc.path, tc.encoding, tc.header, tc.value, rec.Code, body, rec.Header())
		}
	}
}

// An empty path means the default workdir (else the user's home) for a
// download, as with e2b's envd; uploads and composes, which write, refuse
// it (e2b's would overwrite what is there).
func TestEmptyPath(t *testing.T) {
	h, sb := newHandler(t, "")
	dir := t.TempDir() // the workdir: nothing here touches a home
	file := filepath.Join(dir, "f.txt")
	writeFile(t, file, "keep")
	sb.Apply(wire.EnvdInit{DefaultWorkdir: dir})

	rec := do(h, httptest.NewRequest(http.MethodGet, filesURL("/files", "path", ""), nil))
	wantError(t, rec, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", dir))
	sb.Apply(wire.EnvdInit{DefaultWorkdir: file}) // a workdir that is a file: downloaded
	rec = do(h, httptest.NewRequest(http.MethodGet, filesURL("/files", "path", ""), nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "keep" {
		t.Fatalf("download of an empty path = %d %q, want the workdir's content", rec.Code, rec.Body)
	}

	sb.Apply(wire.EnvdInit{DefaultWorkdir: dir})
	req := httptest.NewRequest(http.MethodPost, filesURL("/files", "path", ""), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	wantError(t, do(h, req), http.StatusBadRequest, "path query is required")
	body, ct := multipartBody(t, part{"file", "", "x"})
	req = httptest.NewRequest(http.MethodPost, "/files", body)
	req.Header.Set("Content-Type", ct)
	wantError(t, do(h, req), http.StatusBadRequest, "without a filename")
	for _, compose := range []string{
		fmt.Sprintf(`{"source_paths":[%q],"destination":""}`, file),
		fmt.Sprintf(`{"source_paths":[""],"destination":%q}`, filepath.Join(dir, "out")),
	} {
		req = httptest.NewRequest(http.MethodPost, "/files/compose", strings.NewReader(compose))
		req.Header.Set("Content-Type", "application/json")
		if rec := do(h, req); rec.Code != http.StatusBadRequest {
			t.Fatalf("compose %s = %d %s, want 400", compose, rec.Code, rec.Body)
		}
	}
	if got := readFile(t, file); got != "keep" {
		t.Fatalf("the workdir's file after the refused requests = %q", got)
	}
}

func TestMethodsAndRoutes(t *testing.T) {
	h, _ := newHandler(t, "")
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPut, "/files", 405},
		{http.MethodDelete, "/files", 405},
		{http.MethodGet, "/files/compose", 405},
		{http.MethodGet, "/files/other", 404},
	} {
		rec := do(h, httptest.NewRequest(tc.method, tc.path, nil))
		wantError(t, rec, tc.status, "")
	}
}

// part is one multipart part.
type part struct {
	name, filename, content string
}

// multipartBody encodes parts; it returns the body and its Content-Type.
func multipartBody(t *testing.T, parts ...part) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		hdr := textproto.MIMEHeader{}
		cd := fmt.Sprintf(`form-data; name=%q`, p.name)
		if p.filename != "" {
			cd += fmt.Sprintf(`; filename=%q`, p.filename)
		}
		hdr.Set("Content-Disposition", cd)
		hdr.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(hdr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(w, p.content); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf, mw.FormDataContentType()
}

// uploadResult decodes a 200 upload response.
func uploadResult(t *testing.T, rec *httptest.ResponseRecorder) []uploadedEntry {
	t.Helper()
	if rec.Code != 200 {
		t.Fatalf("status = %d; body %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var out []uploadedEntry
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("response %q: %v", rec.Body, err)
	}
	return out
}

// getXattr reads a user.e2b.<key> attribute; ok is false when it is absent.
func getXattr(t *testing.T, p, key string) (string, bool) {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := syscall.Getxattr(p, "user.e2b."+key, buf)
	if err == syscall.ENODATA {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n]), true
}

func TestUpload(t *testing.T) {
	h, sb := newHandler(t, "")
	dir := t.TempDir()
	root, err := sb.User("")
	if err != nil {
		t.Fatal(err)
	}
	// Relative names resolve against root's home: use a fresh folder there.
	homeDir, err := os.MkdirTemp(root.Home, "envd-files-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(homeDir) })
	relDir := filepath.Base(homeDir)
	// Uploads acting as another user: TestUploadAsUserIsCheckedAsTheUser.

	tests := []struct {
		name    string
		query   []string
		parts   []part // multipart body when set
		raw     []byte // octet-stream body otherwise
		headers map[string]string
		status  int
		errPart string
		want    map[string]string // path → content after the upload
		check   func(t *testing.T, entries []uploadedEntry)
	}{
		{
			name:  "multipart single with path",
			query: []string{"path", filepath.Join(dir, "single.txt")},
			parts: []part{{"file", "ignored-name", "one"}},
			want:  map[string]string{filepath.Join(dir, "single.txt"): "one"},
			check: func(t *testing.T, e []uploadedEntry) {
				want := uploadedEntry{Name: "single.txt", Path: filepath.Join(dir, "single.txt"), Type: "file"}
				if len(e) != 1 || e[0].Name != want.Name || e[0].Path != want.Path || e[0].Type != want.Type || e[0].Metadata != nil {
					t.Errorf("entries = %+v", e)
				}
			},
		},
		{
			name: "multi-file by filename incl relative, other parts ignored",
			parts: []part{
				{"file", filepath.Join(dir, "x1"), "first"},
				{"other", "", "ignored"},
				{"file", relDir + "/sub/x2", "second"},
			},
			want: map[string]string{filepath.Join(dir, "x1"): "first", filepath.Join(homeDir, "sub/x2"): "second"},
			check: func(t *testing.T, e []uploadedEntry) {
				if len(e) != 2 || e[1].Path != filepath.Join(homeDir, "sub/x2") || e[1].Name != "x2" {
					t.Errorf("entries = %+v", e)
				}
			},
		},
		{
			name:    "duplicate path",
			parts:   []part{{"file", filepath.Join(dir, "dup"), "a"}, {"file", filepath.Join(dir, "sub/../dup"), "b"}},
			status:  400,
			errPart: "more than once",
		},
		{
			name:    "two file parts with path query",
			query:   []string{"path", filepath.Join(dir, "two")},
			parts:   []part{{"file", "a", "a"}, {"file", "b", "b"}},
			status:  400,
			errPart: "only one file part",
		},
		{name: "no file parts", parts: []part{{"other", "x", "y"}}, status: 400, errPart: "no file part"},
		{name: "file part without filename", parts: []part{{"file", "", "y"}}, status: 400, errPart: "without a filename"},
		{
			name:  "octet-stream",
			query: []string{"path", filepath.Join(dir, "raw.bin")},
			raw:   []byte("raw bytes"),
			want:  map[string]string{filepath.Join(dir, "raw.bin"): "raw bytes"},
		},
		{
			name:    "gzip octet-stream",
			query:   []string{"path", filepath.Join(dir, "gz.bin")},
			raw:     gzipBytes(t, "unzipped"),
			headers: map[string]string{"Content-Encoding": "gzip"},
			want:    map[string]string{filepath.Join(dir, "gz.bin"): "unzipped"},
		},
		{
			name:    "bad gzip",
			query:   []string{"path", filepath.Join(dir, "badgz")},
			raw:     []byte("not gzip"),
			headers: map[string]string{"Content-Encoding": "gzip"},
			status:  400,
			errPart: "gzip",
		},
		{
			name:    "br rejected",
			query:   []string{"path", filepath.Join(dir, "br")},
			raw:     []byte("x"),
			headers: map[string]string{"Content-Encoding": "br"},
			status:  400,
			errPart: "Content-Encoding",
		},
		{name: "octet-stream without path", raw: []byte("x"), status: 400, errPart: "path query is required"},
		{name: "another user's home", query: []string{"path", "~nobody/x"}, raw: []byte("x"), status: 400, errPart: "cannot expand user-specific home dir"},
		{
			name:    "unsupported content type",
			query:   []string{"path", filepath.Join(dir, "ct")},
			raw:     []byte("x"),
			headers: map[string]string{"Content-Type": "text/plain"},
			status:  400,
			errPart: "Content-Type",
		},
		{
			name:    "onto a directory",
			query:   []string{"path", dir},
			raw:     []byte("x"),
			status:  400,
			errPart: "is a directory",
		},
		{
			name:    "parent is a file",
			query:   []string{"path", filepath.Join(dir, "raw.bin", "x")},
			raw:     []byte("x"),
			status:  400,
			errPart: "not a directory",
		},
		{
			name:    "unknown user",
			query:   []string{"path", filepath.Join(dir, "u"), "username", "no-such-user-x"},
			raw:     []byte("x"),
			status:  401,
			errPart: "invalid username: 'no-such-user-x'",
		},
		{
			name:    "invalid metadata",
			query:   []string{"path", filepath.Join(dir, "badmd")},
			raw:     []byte("x"),
			headers: map[string]string{"X-Metadata-Big": strings.Repeat("v", 5000)},
			status:  400,
			errPart: "invalid metadata",
		},
		{
			// e2b's envd: values are printable ASCII too, and the 4096-byte
			// budget counts each stored name (user.e2b.<key>) with its value.
			name:    "metadata value not ASCII",
			query:   []string{"path", filepath.Join(dir, "badmd")},
			raw:     []byte("x"),
			headers: map[string]string{"X-Metadata-Note": "café"},
			status:  400,
			errPart: `invalid metadata: metadata value for key "note" contains non-printable-ASCII byte 0xc3 at offset 3`,
		},
		{
			name:    "metadata over budget with the prefix",
			query:   []string{"path", filepath.Join(dir, "badmd")},
			raw:     []byte("x"),
			headers: map[string]string{"X-Metadata-K": strings.Repeat("v", 4096-len("user.e2b.k")+1)},
			status:  400,
			errPart: "invalid metadata: total metadata size 4097 exceeds 4096 bytes",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var req *http.Request
			if tc.parts != nil {
				body, ct := multipartBody(t, tc.parts...)
				req = httptest.NewRequest(http.MethodPost, filesURL("/files", tc.query...), body)
				req.Header.Set("Content-Type", ct)
			} else {
				req = httptest.NewRequest(http.MethodPost, filesURL("/files", tc.query...), bytes.NewReader(tc.raw))
				req.Header.Set("Content-Type", "application/octet-stream")
			}
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := do(h, req)
			if tc.errPart != "" {
				wantError(t, rec, tc.status, tc.errPart)
				assertNoTempFiles(t, dir)
				return
			}
			entries := uploadResult(t, rec)
			for p, content := range tc.want {
				if got := readFile(t, p); got != content {
					t.Errorf("%s = %q, want %q", p, got, content)
				}
			}
			if tc.check != nil {
				tc.check(t, entries)
			}
			assertNoTempFiles(t, dir)
		})
	}
}

// assertNoTempFiles fails when a route left a temporary file in dir (a
// compose's replacement, or one an upload should never write).
func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".envd-") {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

func TestUploadMetadata(t *testing.T) {
	h, _ := newHandler(t, "")
	p := filepath.Join(t.TempDir(), "md.txt")
	upload := func(headers map[string]string) []uploadedEntry {
		body, ct := multipartBody(t, part{"file", p, "data"})
		req := httptest.NewRequest(http.MethodPost, "/files", body)
		req.Header.Set("Content-Type", ct)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		return uploadResult(t, do(h, req))
	}
	entries := upload(map[string]string{"X-Metadata-Owner": "Alice", "x-metadata-kind": "doc"})
	if len(entries) != 1 || entries[0].Metadata["owner"] != "Alice" || entries[0].Metadata["kind"] != "doc" {
		t.Fatalf("entries = %+v", entries)
	}
	if v, ok := getXattr(t, p, "owner"); !ok || v != "Alice" {
		t.Fatalf("xattr owner = %q, %v", v, ok)
	}
	if v, ok := getXattr(t, p, "kind"); !ok || v != "doc" {
		t.Fatalf("xattr kind = %q, %v", v, ok)
	}
	// Without metadata headers, an upload clears the metadata.
	entries = upload(nil)
	if entries[0].Metadata != nil {
		t.Fatalf("metadata = %v, want none", entries[0].Metadata)
	}
	if _, ok := getXattr(t, p, "owner"); ok {
		t.Fatal("metadata survived an upload without metadata headers")
	}
	if got := readFile(t, p); got != "data" {
		t.Fatalf("content = %q", got)
	}
}

// An upload with metadata to a filesystem without user xattrs (ramfs here)
// writes the file without its metadata, as e2b's envd does, and the answer
// claims none.
func TestUploadMetadataWithoutXattrs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a ramfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "ramfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The tests run in a mount namespace of their own (hosttest): the mount
	// is not seen outside, and goes with the namespace at the latest.
	if err := syscall.Mount("envd-test", dir, "ramfs", 0, "mode=0755"); err != nil {
		t.Skipf("mount ramfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	if err := syscall.Setxattr(dir, "user.probe", []byte("x"), 0); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Skipf("ramfs takes user xattrs here (setxattr: %v)", err)
	}

	h, _ := newHandler(t, "")
	p := filepath.Join(dir, "md.txt")
	req := httptest.NewRequest(http.MethodPost, filesURL("/files", "path", p), strings.NewReader("data"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Metadata-Owner", "alice")
	entries := uploadResult(t, do(h, req))
	if len(entries) != 1 || entries[0].Path != p || entries[0].Metadata != nil {
		t.Fatalf("entries = %+v, want %s without metadata", entries, p)
	}
	if got := readFile(t, p); got != "data" {
		t.Fatalf("content = %q, want data", got)
	}
}

func TestUploadPreservesModeAndFollowsSymlink(t *testing.T) {
	h, _ := newHandler(t, "")
	dir := t.TempDir()
	target := filepath.Join(dir, "script.sh")
	writeFile(t, target, "old")
	if err := os.Chmod(target, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, filesURL("/files", "path", link), strings.NewReader("new"))
	req.Header.Set("Content-Type", "application/octet-stream")
	entries := uploadResult(t, do(h, req))
	if entries[0].Path != link {
		t.Errorf("path = %q, want %q", entries[0].Path, link)
	}
	if got := readFile(t, target); got != "new" {
		t.Errorf("target = %q", got)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("symlink replaced: %v %v", fi, err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode = %v, want 0755", fi.Mode().Perm())
	}
}

func TestSignatures(t *testing.T) {
	h, _ := newHandler(t, testToken)
	dir := t.TempDir()
	file := filepath.Join(dir, "signed.txt")
	writeFile(t, file, "signed")
	now := h.now().Unix()
	future, past := now+60, now-1

	sign := func(path, op, user string, exp *int64) []string {
		q := []string{"path", path, "signature", Signature(path, op, user, testToken, exp)}
		if user != "" {
			q = append(q, "username", user)
		}
		if exp != nil {
			q = append(q, "signature_expiration", strconv.FormatInt(*exp, 10))
		}
		return q
	}
	tamper := func(q []string, key, value string) []string {
		out := append([]string(nil), q...)
		for i := 0; i+1 < len(out); i += 2 {
			if out[i] == key {
				out[i+1] = value
			}
		}
		return out
	}
	valid := sign(file, opRead, "", nil)
	sig := valid[3]

	// e2b envd's messages (its validateSigning).
	const invalid, headerMismatch = "invalid signature", "access token present in header but does not match"
	tests := []struct {
		name    string
		method  string
		query   []string
		header  string // X-Access-Token
		status  int
		message string // of a 401, exactly
	}{
		{"valid read", "GET", valid, "", 200, ""},
		{"valid read with user and expiry", "GET", sign(file, opRead, "root", &future), "", 200, ""},
		{"valid write", "POST", sign(file, opWrite, "", nil), "", 200, ""},
		{"write signature on read", "GET", sign(file, opWrite, "", nil), "", 401, invalid},
		{"read signature on write", "POST", valid, "", 401, invalid},
		{"expired", "GET", sign(file, opRead, "", &past), "", 401, "signature is already expired"},
		{"expiry stripped", "GET", tamper(sign(file, opRead, "", &future), "signature_expiration", ""), "", 401, invalid},
		{"expiry extended", "GET", tamper(sign(file, opRead, "", &future), "signature_expiration", strconv.FormatInt(future+1, 10)), "", 401, invalid},
		{"expired and tampered", "GET", tamper(sign(file, opRead, "", &past), "signature", tampered(sig)), "", 401, invalid},
		{"tampered signature", "GET", tamper(valid, "signature", tampered(sig)), "", 401, invalid},
		{"other path", "GET", tamper(valid, "path", file+"x"), "", 401, invalid},
		{"user added", "GET", append(append([]string(nil), valid...), "username", "root"), "", 401, invalid},
		{"no credentials", "GET", []string{"path", file}, "", 401, "missing signature query parameter"},
		{"header token", "GET", []string{"path", file}, testToken, 200, ""},
		{"wrong header token", "GET", []string{"path", file}, "wrong", 401, headerMismatch},
		{"wrong header token beats signature", "GET", valid, "wrong", 401, headerMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, filesURL("/files", tc.query...), strings.NewReader("signed"))
			req.Header.Set("Content-Type", "application/octet-stream")
			if tc.header != "" {
				req.Header.Set(wire.AccessTokenHeader, tc.header)
			}
			rec := do(h, req)
			if tc.status == 401 {
				// e2b envd's body, byte for byte.
				if want := `{"code":401,"message":"` + tc.message + `"}`; rec.Code != 401 || strings.TrimSpace(rec.Body.String()) != want {
					t.Fatalf("= %d %s, want 401 %s", rec.Code, rec.Body, want)
				}
				return
			}
			if rec.Code != tc.status {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tc.status, rec.Body)
			}
		})
	}

	t.Run("no token set", func(t *testing.T) {
		open, _ := newHandler(t, "")
		rec := do(open, httptest.NewRequest(http.MethodGet, filesURL("/files", "path", file, "signature", "v1_garbage"), nil))
		if rec.Code != 200 || rec.Body.String() != "signed" {
			t.Fatalf("status %d body %q", rec.Code, rec.Body)
		}
	})
	t.Run("sdk-style encoding", func(t *testing.T) {
		// The SDK percent-encodes "/" and "+" of the signature.
		s := Signature(file, opRead, "", testToken, nil)
		raw := "/files?path=" + url.QueryEscape(file) + "&signature=" + strings.NewReplacer("/", "%2F", "+", "%2B").Replace(s)
		if rec := do(h, httptest.NewRequest(http.MethodGet, raw, nil)); rec.Code != 200 {
			t.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	})
}

func TestSignatureKnownVector(t *testing.T) {
	// sha256("/home/user/f:read:user:tok:123"), base64 without padding.
	got := Signature("/home/user/f", "read", "user", "tok", new(int64(123)))
	if !strings.HasPrefix(got, "v1_") || len(got) != 3+43 || strings.ContainsAny(got, "=") {
		t.Fatalf("signature %q has the wrong shape", got)
	}
	if got == Signature("/home/user/f", "read", "user", "tok", nil) {
		t.Fatal("expiration does not change the signature")
	}
}

func TestCompose(t *testing.T) {
	h, _ := newHandler(t, testToken)
	dir := t.TempDir()
	// Composing as another user: TestComposeAsUserIsCheckedAsTheUser.
	post := func(body string, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/files/compose", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set(wire.AccessTokenHeader, token)
		}
		return do(h, req)
	}
	mkJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	t.Run("ok", func(t *testing.T) {
		a, b := filepath.Join(dir, "a.part"), filepath.Join(dir, "b.part")
		writeFile(t, a, "hello, ")
		writeFile(t, b, "world")
		dest := filepath.Join(dir, "out/joined.txt")
		rec := post(mkJSON(map[string]any{"source_paths": []string{a, b}, "destination": dest}), testToken)
		if rec.Code != 200 {
			t.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
		// e2b's OpenAPI EntryInfo, as its envd answers a compose: name,
		// path and type "file", nothing else.
		var info map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil {
			t.Fatal(err)
		}
		if len(info) != 3 || info["name"] != "joined.txt" || info["path"] != dest || info["type"] != "file" {
			t.Errorf("entry info = %s, want {name, path, type: file}", rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q", ct)
		}
		if got := readFile(t, dest); got != "hello, world" {
			t.Errorf("content = %q", got)
		}
		for _, p := range []string{a, b} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("source %s not deleted: %v", p, err)
			}
		}
		if uid, _ := owner(t, dest); uid != 0 {
			t.Errorf("owner = %d, want root's", uid)
		}
		assertNoTempFiles(t, dir)
	})
	t.Run("destination among sources", func(t *testing.T) {
		a, b := filepath.Join(dir, "keep"), filepath.Join(dir, "more")
		writeFile(t, a, "1")
		writeFile(t, b, "2")
		rec := post(mkJSON(map[string]any{"source_paths": []string{a, b}, "destination": a}), testToken)
		if rec.Code != 200 || readFile(t, a) != "12" {
			t.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	})
	for _, tc := range []struct {
		name, body, token string
		status            int
		errPart           string
	}{
		{"missing source", mkJSON(map[string]any{"source_paths": []string{filepath.Join(dir, "nope")}, "destination": filepath.Join(dir, "d")}), testToken, 404, "does not exist"},
		{"directory source", mkJSON(map[string]any{"source_paths": []string{dir}, "destination": filepath.Join(dir, "d")}), testToken, 400, "is a directory"},
		{"empty list", mkJSON(map[string]any{"source_paths": []string{}, "destination": filepath.Join(dir, "d")}), testToken, 400, "source_paths"},
		{"no destination", mkJSON(map[string]any{"source_paths": []string{"x"}}), testToken, 400, "destination"},
		{"bad json", `{"source_paths":`, testToken, 400, "invalid request body"},
		{"trailing data", `{"source_paths":["x"],"destination":"y"} {}`, testToken, 400, "invalid request body"},
		{"unknown user", mkJSON(map[string]any{"source_paths": []string{"x"}, "destination": "y", "username": "no-such-user-x"}), testToken, 401, "invalid username"},
		{"no token", mkJSON(map[string]any{"source_paths": []string{"x"}, "destination": "y"}), "", 401, unauthorizedMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, post(tc.body, tc.token), tc.status, tc.errPart)
		})
	}
}

// patternReader yields n deterministic pseudo-random bytes without holding
// them in memory.
type patternReader struct {
	n, off int64
	state  uint64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	if rem := p.n - p.off; int64(len(b)) > rem {
		b = b[:rem]
	}
	for i := range b {
		p.state = p.state*6364136223846793005 + 1442695040888963407
		b[i] = byte(p.state >> 56)
	}
	p.off += int64(len(b))
	return len(b), nil
}

func TestLargeRoundTripStreams(t *testing.T) {
	const size = 50 << 20
	h, _ := newHandler(t, testToken)
	srv := httptest.NewServer(h)
	defer srv.Close()
	dest := filepath.Join(t.TempDir(), "big.bin")
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	// Upload: the multipart body is produced on the fly through a pipe.
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		fw, err := mw.CreateFormFile("file", dest)
		if err == nil {
			_, err = io.Copy(fw, &patternReader{n: size})
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/files", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set(wire.AccessTokenHeader, testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	if fi, err := os.Stat(dest); err != nil || fi.Size() != size {
		t.Fatalf("uploaded file: %v %v", fi, err)
	}

	// Download with a signed URL and compare as a stream.
	q := url.Values{"path": {dest}, "signature": {Signature(dest, opRead, "", testToken, nil)}}
	// Ask for identity explicitly: Go's client would otherwise ask for gzip.
	req, err = http.NewRequest(http.MethodGet, srv.URL+"/files?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != size {
		t.Fatalf("download: %d, length %d", resp.StatusCode, resp.ContentLength)
	}
	if err := sameStream(resp.Body, &patternReader{n: size}); err != nil {
		t.Fatal(err)
	}
	// Streaming allocates a few buffers, never anything like the file.
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/4 {
		t.Errorf("round trip of %d bytes allocated %d bytes: not streaming", size, alloc)
	} else {
		t.Logf("round trip of %d bytes allocated %d bytes", size, alloc)
	}
}

// sameStream compares two readers chunk by chunk.
func sameStream(a, b io.Reader) error {
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	var off int64
	for {
		na, ea := io.ReadFull(a, ba)
		nb, eb := io.ReadFull(b, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return fmt.Errorf("streams differ near offset %d (%d vs %d bytes)", off, na, nb)
		}
		off += int64(na)
		if ea != nil || eb != nil {
			if (ea == io.EOF || ea == io.ErrUnexpectedEOF) && (eb == io.EOF || eb == io.ErrUnexpectedEOF) {
				return nil
			}
			return fmt.Errorf("read at %d: %w / %w", off, ea, eb)
		}
	}
}

func TestNegotiateEncoding(t *testing.T) {
	for _, tc := range []struct {
		header         []string
		preferIdentity bool
		want           string
	}{
		{nil, false, "identity"},
		{[]string{""}, false, "identity"},
		{[]string{"gzip"}, false, "gzip"},
		{[]string{"GZIP;Q=1.000"}, false, "gzip"},
		{[]string{"x-gzip"}, false, "gzip"},
		{[]string{"gzip"}, true, "identity"},
		{[]string{"gzip;q=0"}, false, "identity"},
		{[]string{"gzip;q=0, identity;q=0"}, false, ""},
		{[]string{"br"}, false, "identity"},
		{[]string{"br, identity;q=0"}, false, ""},
		{[]string{"*"}, false, "gzip"},
		{[]string{"*;q=0"}, false, ""},
		{[]string{"*;q=0, identity"}, false, "identity"},
		{[]string{"identity;q=0.5, gzip;q=0.4"}, false, "identity"},
		{[]string{"identity;q=0", "gzip;q=0.001"}, false, "gzip"},
		{[]string{"gzip;q=2"}, false, "identity"},
		{[]string{"gzip;q=0.1234"}, false, "identity"},
		{[]string{"gzip;q=abc, identity;q=0"}, false, ""},
		{[]string{"deflate, gzip;q=0.8, identity;q=0.9"}, false, "identity"},
	} {
		if got := negotiateEncoding(tc.header, tc.preferIdentity); got != tc.want {
			t.Errorf("negotiateEncoding(%q, %v) = %q, want %q", tc.header, tc.preferIdentity, got, tc.want)
		}
	}
}

func TestUploadPartHeaderLimit(t *testing.T) {
	h, _ := newHandler(t, "")
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("a", 200)+"/") + strings.Repeat("b", maxPartHeaderBytes)
	body, ct := multipartBody(t, part{"file", long, "x"})
	req := httptest.NewRequest(http.MethodPost, "/files", body)
	req.Header.Set("Content-Type", ct)
	wantError(t, do(h, req), 400, "too large")
	assertNoTempFiles(t, dir)
}

// failWriter fails every write with err.
type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

func TestErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		msg    string
	}{
		{"no space while writing", copyBody(failWriter{&os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}}, strings.NewReader("data")), 507, noSpaceMessage},
		{"quota", fsError(fmt.Errorf("create file: %w", syscall.EDQUOT), "create"), 507, noSpaceMessage},
		{"plain ENOSPC", fmt.Errorf("sync: %w", syscall.ENOSPC), 507, noSpaceMessage},
		{"read failure", copyBody(io.Discard, io.MultiReader(strings.NewReader("x"), iotestErrReader{})), 400, "read request body"},
		{"not a directory", fsError(syscall.ENOTDIR, "mkdir"), 400, "not a directory"},
		{"other", fmt.Errorf("boom"), 500, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeError(rec, tc.err)
			wantError(t, rec, tc.status, tc.msg)
		})
	}
}

// iotestErrReader fails like a dropped connection.
type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// tampered changes the last character of a signature to another one.
func tampered(sig string) string {
	last := byte('A')
	if sig[len(sig)-1] == last {
		last = 'B'
	}
	return sig[:len(sig)-1] + string(last)
}
