package files

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"

	"github.com/skiff-dev/skiff/envd/internal/entry"
	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// Upload limits.
const (
	metadataHeaderPrefix = "X-Metadata-"
	maxPartHeaderBytes   = 64 << 10 // boundary, preamble and headers read per part
	maxParts             = 10000    // parts of one multipart body
	maxFilenameLen       = 4096     // PATH_MAX
	copyBufferSize       = 256 << 10
)

// uploadedEntry is one element of POST /files' response, and POST
// /files/compose's answer: e2b's OpenAPI EntryInfo.
type uploadedEntry struct {
	Name     string            `json:"name"`
	Path     string            `json:"path"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// upload serves POST /files: a multipart/form-data body of `file` parts, or
// an application/octet-stream body for the `path` query. Every file is
// written in place, as e2b's envd does; if the body fails part-way, the files
// this upload created are removed (files it overwrote keep what was written).
// Paths are resolved, and files and directories created, with the user's
// identity (see createDest).
func (h *handler) upload(w http.ResponseWriter, r *http.Request) error {
	if err := h.authorize(r, opWrite); err != nil {
		return err
	}
	q := r.URL.Query()
	u, err := h.requestUser(r, q.Get(queryUsername))
	if err != nil {
		return err
	}
	md, err := metadataHeaders(r.Header)
	if err != nil {
		return err
	}
	var dest string
	if p := q.Get(queryPath); p != "" {
		if dest, err = uploadPath(p, u); err != nil {
			return err
		}
	}
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid Content-Type: %v", err))
	}
	body, err := decodedBody(r)
	if err != nil {
		return err
	}
	defer body.Close()

	up := &uploader{user: u, md: md, seen: make(map[string]bool)}
	defer up.abort()
	switch mediaType {
	case "multipart/form-data":
		if params["boundary"] == "" {
			return statusf(http.StatusBadRequest, "multipart body without a boundary")
		}
		err = up.multipart(body, params["boundary"], dest)
	case "application/octet-stream":
		if dest == "" {
			return statusf(http.StatusBadRequest, "the path query is required for an %s upload", mediaType)
		}
		err = up.add(dest, body)
	default:
		err = statusf(http.StatusBadRequest, "unsupported Content-Type %q: use multipart/form-data or application/octet-stream", mediaType)
	}
	if err != nil {
		return err
	}
	entries, err := up.commit()
	if err != nil {
		return err
	}
	return writeJSON(w, entries)
}

// metadataHeaders collects X-Metadata-<Key> headers, keys lowercased and
// validated; nil when there are none.
func metadataHeaders(hdr http.Header) (map[string]string, error) {
	var md map[string]string
	for k, vs := range hdr {
		if len(k) < len(metadataHeaderPrefix) || !strings.EqualFold(k[:len(metadataHeaderPrefix)], metadataHeaderPrefix) {
			continue
		}
		if md == nil {
			md = make(map[string]string)
		}
		md[k[len(metadataHeaderPrefix):]] = strings.Join(vs, ", ")
	}
	if md == nil {
		return nil, nil
	}
	md, err := entry.ValidateMetadata(md)
	if err != nil {
		return nil, withStatus(http.StatusBadRequest, err, err.Error())
	}
	return md, nil
}

// decodedBody returns the request body with its Content-Encoding (none,
// identity or gzip) undone; other encodings are 400.
func decodedBody(r *http.Request) (io.ReadCloser, error) {
	var codings []string
	for _, v := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != encodingIdentity {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0:
		return r.Body, nil
	case len(codings) == 1 && (codings[0] == encodingGzip || codings[0] == "x-gzip"):
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid gzip body: %v", err))
		}
		return zr, nil
	}
	return nil, statusf(http.StatusBadRequest, "unsupported Content-Encoding %q: only gzip is supported", strings.Join(codings, ", "))
}

// uploader writes the files of one upload.
type uploader struct {
	user    *identity.User
	md      map[string]string
	seen    map[string]bool
	pending []*destFile
	entries []uploadedEntry
}

// multipart writes the `file` parts of a multipart body: to dest when it is
// set (then only one file part is allowed), else to each part's filename.
func (up *uploader) multipart(body io.Reader, boundary, dest string) error {
	br := &budgetReader{r: body}
	mr := multipart.NewReader(br, boundary)
	files := 0
	for parts := 0; ; parts++ {
		if parts == maxParts {
			return statusf(http.StatusBadRequest, "multipart body has more than %d parts", maxParts)
		}
		br.limit(maxPartHeaderBytes)
		part, err := mr.NextPart()
		br.unlimit()
		if err == io.EOF {
			break
		}
		if err != nil {
			return withStatus(http.StatusBadRequest, err, fmt.Sprintf("read multipart body: %v", err))
		}
		if part.FormName() != "file" {
			if _, err := io.Copy(io.Discard, part); err != nil {
				return readError(err)
			}
			continue
		}
		files++
		p := dest
		if p == "" {
			name, err := partFilename(part.Header.Get("Content-Disposition"))
			if err != nil {
				return err
			}
			if p, err = uploadPath(name, up.user); err != nil {
				return err
			}
		} else if files > 1 {
			return statusf(http.StatusBadRequest, "only one file part is allowed when the path query is set")
		}
		if err := up.add(p, part); err != nil {
			return err
		}
	}
	if files == 0 {
		return statusf(http.StatusBadRequest, "no file part named \"file\" in the multipart body")
	}
	return nil
}

// add streams src into dest.
func (up *uploader) add(dest string, src io.Reader) error {
	if up.seen[dest] {
		return statusf(http.StatusBadRequest, "path '%s' is uploaded more than once", dest)
	}
	up.seen[dest] = true
	a, err := createDest(dest, up.user, inPlace)
	if err != nil {
		return err
	}
	up.pending = append(up.pending, a)
	// The file is written in place, so metadata it had is replaced, and an
	// upload without X-Metadata-* headers clears it. A filesystem without
	// user xattrs gets the file without its metadata, as with e2b's envd, and
	// the answer does not claim any.
	md := up.md
	if err := entry.SetMetadata(a.target, md); err != nil {
		switch {
		case errors.Is(err, entry.ErrInvalidMetadata):
			return withStatus(http.StatusBadRequest, err, err.Error())
		case entry.Unsupported(err):
			md = nil
		default:
			return fsError(err, "set metadata of "+dest)
		}
	}
	if err := copyBody(a.f, src); err != nil {
		return err
	}
	if err := a.finish(); err != nil {
		return err
	}
	up.entries = append(up.entries, uploadedEntry{Name: baseName(dest), Path: dest, Type: "file", Metadata: md})
	return nil
}

// commit keeps every written file.
func (up *uploader) commit() ([]uploadedEntry, error) {
	for _, a := range up.pending {
		if err := a.commit(); err != nil {
			return nil, err
		}
	}
	up.pending = nil
	return up.entries, nil
}

// abort removes the files this upload created and has not committed.
func (up *uploader) abort() {
	for _, a := range up.pending {
		a.abort()
	}
	up.pending = nil
}

// copyBody streams src (request data) into dst, telling a failure to read
// the request (400, 413) from one to write the file (507, 500).
func copyBody(dst io.Writer, src io.Reader) error {
	buf := make([]byte, copyBufferSize)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return fsError(err, "write file")
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil:
			return readError(rerr)
		}
	}
}

// readError answers a failure to read the request body.
func readError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return withStatus(http.StatusRequestEntityTooLarge, err, fmt.Sprintf("read request body: %v", err))
	}
	return withStatus(http.StatusBadRequest, err, fmt.Sprintf("read request body: %v", err))
}

// partFilename returns the filename parameter of a part's
// Content-Disposition: the destination path, as sent (not reduced to its
// base name the way multipart.Part.FileName does).
func partFilename(disposition string) (string, error) {
	if disposition == "" {
		return "", statusf(http.StatusBadRequest, "file part without a Content-Disposition")
	}
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return "", withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid Content-Disposition of a file part: %v", err))
	}
	name, ok := params["filename"]
	if !ok || name == "" {
		return "", statusf(http.StatusBadRequest, "file part without a filename")
	}
	return name, nil
}

// uploadPath validates a destination path from a request and resolves it
// for u: empty names, NUL bytes and overlong names are 400.
func uploadPath(name string, u *identity.User) (string, error) {
	if len(name) > maxFilenameLen {
		return "", statusf(http.StatusBadRequest, "path is longer than %d bytes", maxFilenameLen)
	}
	p, err := identity.ResolvePath(name, u)
	if err != nil {
		return "", withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid path %q: %v", name, err))
	}
	if p == "/" {
		return "", statusf(http.StatusBadRequest, "path '%s' is a directory", p)
	}
	return p, nil
}

// baseName is the last element of a clean absolute path.
func baseName(p string) string {
	return p[strings.LastIndexByte(p, '/')+1:]
}

// budgetReader fails reads beyond a byte budget while one is set: it bounds
// what the multipart reader consumes for a part's boundary and headers.
type budgetReader struct {
	r       io.Reader
	left    int
	limited bool
}

// errPartHeaderTooLarge fails a multipart part whose headers exceed the budget.
var errPartHeaderTooLarge = errors.New("multipart part headers too large")

func (b *budgetReader) limit(n int) { b.left, b.limited = n, true }
func (b *budgetReader) unlimit()    { b.limited = false }

// Read reads from the underlying reader within the budget.
func (b *budgetReader) Read(p []byte) (int, error) {
	if b.limited {
		if b.left <= 0 {
			return 0, errPartHeaderTooLarge
		}
		if len(p) > b.left {
			p = p[:b.left]
		}
	}
	n, err := b.r.Read(p)
	if b.limited {
		b.left -= n
	}
	return n, err //nolint:wrapcheck // a reader passes its source's errors through, io.EOF included
}
