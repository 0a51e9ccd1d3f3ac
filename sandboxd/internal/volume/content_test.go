package volume

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// content calls the content API on a volume at dir, as the SDK does.
type content struct {
	t   *testing.T
	dir string
}

func (c content) do(method, kind string, q url.Values, body string) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, "/"+kind+"?"+q.Encode(), rd)
	w := httptest.NewRecorder()
	ContentHandler(w, r, c.dir, kind)
	return w.Code, w.Body.Bytes()
}

// expect is an answer of status want whose body is an entry.
type expect struct {
	content
	want int
}

func (c content) at(want int) expect { return expect{c, want} }

func (x expect) entry(status int, b []byte) Entry {
	c, want := x.content, x.want
	c.t.Helper()
	if status != want {
		c.t.Fatalf("status %d (%s), want %d", status, b, want)
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		c.t.Fatalf("%s: %v", b, err)
	}
	return e
}

func q(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// errorOf checks an error answer: e2b's {"code": "<status>", "message"}.
func (c content) errorOf(status int, b []byte, want int, contains string) {
	c.t.Helper()
	var e struct{ Code, Message string }
	if status != want || json.Unmarshal(b, &e) != nil || e.Code != itoa(want) || !strings.Contains(e.Message, contains) {
		c.t.Errorf("got %d %s, want %d with %q", status, b, want, contains)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestContent follows e2b's own volume tests (js-sdk tests/volume/
// file.test.ts) through the handler: write, read, overwrite only with
// force, owners and modes as given, directories with parents, stat, list
// to a depth, chmod and chown, recursive remove, and the errors the SDK
// turns into VolumePathNotFoundError and VolumeError.
func TestContent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown")
	}
	c := content{t, t.TempDir()}

	e := c.at(http.StatusCreated).entry(c.do("PUT", "file", q("path", "test.txt"), "Hello, World!"))
	if e.Name != "test.txt" || e.Type != "file" || e.Path != "/test.txt" || e.Size != 13 || e.Mode != 0o666 || e.UID != 9090 || e.GID != 9090 || e.Mtime.IsZero() {
		t.Errorf("written: %+v", e)
	}
	if st, b := c.do("GET", "file", q("path", "/test.txt"), ""); st != 200 || string(b) != "Hello, World!" {
		t.Errorf("read: %d %q", st, b)
	}
	st, b := c.do("PUT", "file", q("path", "/test.txt", "force", "false"), "again")
	c.errorOf(st, b, http.StatusConflict, "already exists")
	c.at(http.StatusCreated).entry(c.do("PUT", "file", q("path", "/test.txt", "force", "true"), "again"))
	if _, b := c.do("GET", "file", q("path", "/test.txt"), ""); string(b) != "again" {
		t.Errorf("after the forced write: %q", b)
	}
	e = c.at(http.StatusCreated).entry(c.do("PUT", "file", q("path", "/owned.txt", "uid", "1000", "gid", "1000", "mode", "420"), ""))
	if e.UID != 1000 || e.GID != 1000 || e.Mode != 0o644 || e.Size != 0 {
		t.Errorf("owned: %+v", e)
	}
	if st, b := c.do("GET", "file", q("path", "/owned.txt"), ""); st != 200 || len(b) != 0 {
		t.Errorf("an empty file: %d %q", st, b)
	}
	st, b = c.do("GET", "file", q("path", "/missing.txt"), "")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	st, b = c.do("PUT", "file", q("path", "/no/parent.txt"), "x")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	st, b = c.do("PUT", "file", q("path", "/test.txt/under"), "x")
	c.errorOf(st, b, http.StatusBadRequest, "must be a directory")

	// Directories.
	e = c.at(http.StatusCreated).entry(c.do("POST", "dir", q("path", "/nested/deep/path", "force", "true"), ""))
	if e.Type != "directory" || e.Path != "/nested/deep/path" || e.Mode != 0o777 {
		t.Errorf("makeDir with parents: %+v", e)
	}
	c.at(http.StatusCreated).entry(c.do("PUT", "file", q("path", "/nested/deep/path/file.txt"), "deep"))
	c.at(http.StatusCreated).entry(c.do("POST", "dir", q("path", "/nested/deep/path", "force", "true"), ""))
	st, b = c.do("POST", "dir", q("path", "/nested/deep/path"), "")
	c.errorOf(st, b, http.StatusConflict, "already exists")
	st, b = c.do("POST", "dir", q("path", "/a/b"), "")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	e = c.at(http.StatusCreated).entry(c.do("POST", "dir", q("path", "/meta", "uid", "1000", "gid", "1000", "mode", "493"), ""))
	if e.UID != 1000 || e.GID != 1000 || e.Mode != 0o755 {
		t.Errorf("makeDir with metadata: %+v", e)
	}

	// Stat, list.
	if e := c.at(200).entry(c.do("GET", "path", q("path", "/nested"), "")); e.Type != "directory" || e.Name != "nested" {
		t.Errorf("stat: %+v", e)
	}
	st, b = c.do("GET", "path", q("path", "/non-existent.txt"), "")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	names := func(depth string) []string {
		st, b := c.do("GET", "dir", q("path", "/", "depth", depth), "")
		var es []Entry
		if st != 200 || json.Unmarshal(b, &es) != nil {
			t.Fatalf("list: %d %s", st, b)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Path)
		}
		slices.Sort(out)
		return out
	}
	if got := names("1"); !slices.Equal(got, []string{"/meta", "/nested", "/owned.txt", "/test.txt"}) {
		t.Errorf("list /: %v", got)
	}
	if got := names("4"); len(got) != 7 || !slices.Contains(got, "/nested/deep/path/file.txt") {
		t.Errorf("list / to depth 4: %v", got)
	}
	st, b = c.do("GET", "dir", q("path", "/", "depth", "11"), "")
	c.errorOf(st, b, http.StatusBadRequest, "depth must be between 1 and 10")
	st, b = c.do("GET", "dir", q("path", "/gone"), "")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	if st, b := c.do("GET", "dir", q("path", "/meta"), ""); st != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("an empty directory lists as %d %s, want []", st, b)
	}

	// Chmod, chown.
	e = c.at(200).entry(c.do("PATCH", "path", q("path", "/test.txt"), `{"uid":1001,"gid":1001,"mode":493}`))
	if e.UID != 1001 || e.GID != 1001 || e.Mode != 0o755 {
		t.Errorf("updateMetadata: %+v", e)
	}
	st, b = c.do("PATCH", "path", q("path", "/missing"), `{"mode":493}`)
	c.errorOf(st, b, http.StatusNotFound, "not found")

	// Remove: recursive; not the root.
	if st, _ := c.do("DELETE", "path", q("path", "/nested"), ""); st != http.StatusNoContent {
		t.Errorf("remove a directory: %d", st)
	}
	st, b = c.do("GET", "path", q("path", "/nested/deep"), "")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	st, b = c.do("DELETE", "path", q("path", "/nested"), "")
	c.errorOf(st, b, http.StatusNotFound, "not found")
	st, b = c.do("DELETE", "path", q("path", "/"), "")
	c.errorOf(st, b, http.StatusBadRequest, "cannot delete root")

	// Nothing leaves the volume.
	outside := filepath.Join(filepath.Dir(c.dir), "outside.txt")
	_ = os.WriteFile(outside, []byte("secret"), 0o600)
	if st, b := c.do("GET", "file", q("path", "/../outside.txt"), ""); st == 200 {
		t.Errorf("read through ..: %s", b)
	}
	if err := os.Symlink(outside, filepath.Join(c.dir, "link")); err != nil {
		t.Fatal(err)
	}
	if st, b := c.do("GET", "file", q("path", "/link"), ""); st == 200 {
		t.Errorf("read through a symlink out: %s", b)
	}
	if e := c.at(200).entry(c.do("GET", "path", q("path", "/link"), "")); e.Type != "symlink" || e.Target != outside {
		t.Errorf("a symlink's stat: %+v", e)
	}
	if st, _ := c.do("PUT", "file", q("path", "/link", "force", "true"), "overwritten"); st == http.StatusCreated {
		t.Error("a write through a symlink out succeeded")
	}
	if b, _ := os.ReadFile(outside); string(b) != "secret" {
		t.Errorf("the file outside: %q", b)
	}
	st, b = c.do("GET", "file", url.Values{}, "")
	c.errorOf(st, b, http.StatusBadRequest, "path is required")
}

// failingBody gives some bytes, then fails, as a client that goes away.
type failingBody struct{ n int }

func (f *failingBody) Read(p []byte) (int, error) {
	if f.n > 0 {
		n := min(len(p), f.n)
		f.n -= n
		return n, nil
	}
	return 0, errors.New("client went away")
}

// TestContentSpecialFiles: a FIFO (which a sandbox may make in its volume)
// is refused at once, never opened for I/O that would wait on a peer; a
// new file whose upload fails is not left half written.
func TestContentSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	c := content{t, dir}
	done := make(chan struct{})
	go func() {
		defer close(done)
		st, b := c.do("GET", "file", q("path", "/fifo"), "")
		c.errorOf(st, b, http.StatusBadRequest, "not a regular file")
		st, b = c.do("PUT", "file", q("path", "/fifo", "force", "true"), "x")
		c.errorOf(st, b, http.StatusBadRequest, "not a regular file")
		st, b = c.do("GET", "dir", q("path", "/fifo"), "")
		c.errorOf(st, b, http.StatusBadRequest, "not a regular file")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the content API waits on a FIFO")
	}

	r := httptest.NewRequest(http.MethodPut, "/file?"+q("path", "/partial.bin").Encode(), &failingBody{n: 4096})
	w := httptest.NewRecorder()
	ContentHandler(w, r, dir, "file")
	if w.Code < 400 {
		t.Errorf("an upload cut short: %d %s", w.Code, w.Body)
	}
	if _, err := os.Lstat(filepath.Join(dir, "partial.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the half-written file is left: %v", err)
	}
}

// heapWriter is a ResponseWriter that keeps the answer in a file and, at
// each MiB of it, how much of the heap is live.
type heapWriter struct {
	header http.Header
	status int
	file   *os.File
	n      int64
	peak   uint64 // the most live heap seen, past base
	base   uint64
}

func (h *heapWriter) Header() http.Header { return h.header }
func (h *heapWriter) WriteHeader(s int)   { h.status = s }
func (h *heapWriter) Write(p []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	before := h.n
	n, err := h.file.Write(p)
	h.n += int64(n)
	if h.n>>20 != before>>20 {
		h.peak = max(h.peak, liveHeap()-min(h.base, liveHeap()))
	}
	return n, err
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A listing is written while the volume is read: however many files it
// names, sandboxd holds about a batch of each level, not the whole answer.
// Here the answer is about 20 MB; e2b's way (build it, then send it) holds
// all of it.
func TestListIsWrittenWhileRead(t *testing.T) {
	dir := t.TempDir()
	// Links with long targets make a long answer of few files.
	target := strings.Repeat("t", 4000)
	const dirs, files = 4, 1200
	for d := range dirs {
		sub := filepath.Join(dir, "d"+itoa(d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			if err := os.Symlink(target, filepath.Join(sub, itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	out, err := os.Create(filepath.Join(t.TempDir(), "answer"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w := &heapWriter{header: http.Header{}, file: out, base: liveHeap()}
	ContentHandler(w, httptest.NewRequest(http.MethodGet, "/dir?"+q("path", "/", "depth", "2").Encode(), nil), dir, "dir")
	if w.status != http.StatusOK {
		t.Fatalf("status %d", w.status)
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	var es []Entry
	if err := json.NewDecoder(out).Decode(&es); err != nil {
		t.Fatalf("the answer (%d bytes): %v", w.n, err)
	}
	if len(es) != dirs*(files+1) {
		t.Errorf("%d entries, want %d", len(es), dirs*(files+1))
	}
	if w.n < 16<<20 {
		t.Fatalf("the answer is %d bytes: too small to tell", w.n)
	}
	if w.peak > 4<<20 {
		t.Errorf("%d bytes of heap live while a %d-byte answer was written, want a few batches' worth", w.peak, w.n)
	}
	t.Logf("answer %d bytes, live heap at most %d", w.n, w.peak)
}

// goneWriter is a client that goes away after its first write.
type goneWriter struct {
	header http.Header
	writes int
}

func (g *goneWriter) Header() http.Header { return g.header }
func (g *goneWriter) WriteHeader(int)     {}
func (g *goneWriter) Write(p []byte) (int, error) {
	g.writes++
	if g.writes > 1 {
		return 0, errors.New("connection reset by peer")
	}
	return len(p), nil
}

// A listing whose client has gone away cuts its answer off (net/http's
// abort) rather than ending it as if it were whole.
func TestListCutOffWhenTheClientGoes(t *testing.T) {
	dir := t.TempDir()
	for i := range 2000 {
		if err := os.Symlink(strings.Repeat("t", 200), filepath.Join(dir, itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	w := &goneWriter{header: http.Header{}}
	defer func() {
		if r, _ := recover().(error); !errors.Is(r, http.ErrAbortHandler) {
			t.Errorf("the handler ended with %v, want net/http's abort", r)
		}
	}()
	ContentHandler(w, httptest.NewRequest(http.MethodGet, "/dir?"+q("path", "/").Encode(), nil), dir, "dir")
}

// A symlink made inside a sandbox to an absolute path or above the root
// (which e2b's chroot resolves within the volume, most often to nothing)
// answers 404, as a missing path, not 500.
func TestContentEscapingSymlink(t *testing.T) {
	dir := t.TempDir()
	for name, target := range map[string]string{"abs": "/home/user/vol/missing", "up": "../../etc/passwd"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	c := content{t, dir}
	for _, p := range []string{"/abs", "/up"} {
		st, b := c.do("GET", "file", q("path", p), "")
		c.errorOf(st, b, http.StatusNotFound, "not found")
	}
}
