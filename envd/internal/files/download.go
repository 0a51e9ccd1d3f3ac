package files

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// download serves GET (and HEAD) /files?path=…: the file's bytes through
// http.ServeContent (Range, conditional requests), or read to their end,
// gzip-compressed when the client prefers it.
func (h *handler) download(w http.ResponseWriter, r *http.Request) error {
	if err := h.authorize(r, opRead); err != nil {
		return err
	}
	q := r.URL.Query()
	u, err := h.requestUser(r, q.Get(queryUsername))
	if err != nil {
		return err
	}
	// An empty path is the default workdir, else the user's home, as with
	// e2b's envd (a download only reads; uploads refuse it).
	p, err := identity.ResolveReadPath(q.Get(queryPath), u, h.sb.Workdir())
	if err != nil {
		return withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid path '%s': %v", q.Get(queryPath), err))
	}
	// Read as root, whoever the user, as e2b's envd reads.
	f, fi, err := openRegular(p)
	if err != nil {
		return err
	}
	defer f.Close()

	hdr := w.Header()
	hdr.Add("Vary", "Accept-Encoding")
	enc := negotiateEncoding(r.Header.Values("Accept-Encoding"), r.Header.Get("Range") != "")
	if enc == "" {
		return statusf(http.StatusNotAcceptable, "no acceptable content encoding: supported are %s and %s", encodingGzip, encodingIdentity)
	}
	name := filepath.Base(p)
	if cd := mime.FormatMediaType("inline", map[string]string{"filename": name}); cd != "" {
		hdr.Set("Content-Disposition", cd)
	} else {
		hdr.Set("Content-Disposition", "inline")
	}
	// A file whose size says 0 may hold more: a /proc or /sys file
	// (ServeContent would find its size by seeking to its end, which most
	// of them refuse, or answer it empty), and its time of change says
	// nothing of what it holds. It is read to its end, never from a range
	// or answered 304.
	pseudo := fi.Size() == 0
	if enc == encodingIdentity && !pseudo {
		http.ServeContent(w, r, name, fi.ModTime(), f)
		return nil
	}
	// Else typed by its extension, else application/octet-stream, as
	// e2b's envd types a compressed download.
	ct := mime.TypeByExtension(filepath.Ext(p))
	if ct == "" {
		ct = "application/octet-stream"
	}
	hdr.Set("Content-Type", ct)
	if enc == encodingIdentity {
		stream(w, r, f, fi)
		return nil
	}
	// A compressed body has no byte ranges of the file: served whole, read
	// to its end whatever its size says (as e2b's envd reads it). A
	// conditional request is ServeContent's to answer (304).
	gw := &gzipResponseWriter{ResponseWriter: w, head: r.Method == http.MethodHead}
	if conditional(r) && !pseudo {
		r = r.Clone(r.Context())
		r.Header.Del("Range")
		r.Header.Del("If-Range")
		http.ServeContent(gw, r, name, fi.ModTime(), f)
	} else {
		stream(gw, r, f, fi)
	}
	// The status line is out: a failure now can only cut the body short.
	_ = gw.Close()
	return nil
}

// conditional reports whether r asks a conditional GET.
func conditional(r *http.Request) bool {
	for _, h := range []string{"If-Modified-Since", "If-None-Match", "If-Match", "If-Unmodified-Since", "If-Range"} {
		if r.Header.Get(h) != "" {
			return true
		}
	}
	return false
}

// stream answers 200 with f read to its end (a HEAD: its headers only),
// with its time of change unless its size says 0 (a /proc file's says
// nothing of what it holds).
func stream(w http.ResponseWriter, r *http.Request, f *os.File, fi fs.FileInfo) {
	if fi.Size() > 0 && !fi.ModTime().IsZero() {
		w.Header().Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		// The status line is out: a failure can only cut the body short.
		_, _ = io.Copy(w, f)
	}
}

// openRegular opens p for reading, refusing what is not a regular file
// without blocking on FIFOs or devices.
func openRegular(p string) (*os.File, fs.FileInfo, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, nil, pathError("stat", p, err)
	}
	if err := checkRegular(p, fi); err != nil {
		return nil, nil, err
	}
	f, err := openFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, pathError("open", p, err)
	}
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return nil, nil, fsError(err, "stat "+p)
	}
	if err := checkRegular(p, fi); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// pathError maps the error of op (stat, open) on p: a missing path is 404
// with e2b's message.
func pathError(op, p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return withStatus(http.StatusNotFound, err, fmt.Sprintf("path '%s' does not exist", p))
	}
	return fsError(err, op+" "+p)
}

// checkRegular answers 400 for a directory or another non-regular file.
func checkRegular(p string, fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return statusf(http.StatusBadRequest, "path '%s' is a directory", p)
	case !fi.Mode().IsRegular():
		return statusf(http.StatusBadRequest, "path '%s' is not a regular file", p)
	}
	return nil
}

// gzipResponseWriter compresses the body of a 200 response; other statuses
// (304, errors) pass through untouched.
type gzipResponseWriter struct {
	http.ResponseWriter
	head        bool // HEAD: headers only, no gzip stream
	wroteHeader bool
	gz          *gzip.Writer
}

// WriteHeader switches a 200 response to gzip.
func (g *gzipResponseWriter) WriteHeader(code int) {
	if g.wroteHeader {
		return
	}
	g.wroteHeader = true
	if code == http.StatusOK {
		hdr := g.Header()
		hdr.Del("Content-Length")
		hdr.Set("Content-Encoding", encodingGzip)
		if !g.head {
			g.gz, _ = gzip.NewWriterLevel(g.ResponseWriter, gzip.BestSpeed) // the level is valid
		}
	}
	g.ResponseWriter.WriteHeader(code)
}

// Write writes body bytes, compressed when the response is gzip.
func (g *gzipResponseWriter) Write(p []byte) (int, error) {
	if !g.wroteHeader {
		g.WriteHeader(http.StatusOK)
	}
	if g.gz != nil {
		n, err := g.gz.Write(p)
		if err != nil {
			return n, fmt.Errorf("write gzip body: %w", err)
		}
		return n, nil
	}
	n, err := g.ResponseWriter.Write(p)
	if err != nil {
		return n, fmt.Errorf("write body: %w", err)
	}
	return n, nil
}

// Close ends the gzip stream, if one was started.
func (g *gzipResponseWriter) Close() error {
	if g.gz == nil {
		return nil
	}
	if err := g.gz.Close(); err != nil {
		return fmt.Errorf("close gzip body: %w", err)
	}
	return nil
}
