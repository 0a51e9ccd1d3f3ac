// Package files serves envd's plain HTTP file routes, wire-compatible with
// e2b envd 0.6.x: GET /files (download), POST /files (upload, multipart or
// octet-stream) and POST /files/compose (concatenate files into one).
//
// GET and POST /files authenticate themselves, with the X-Access-Token header
// or a signed URL; every error is answered in e2b's HTTP error shape
// {"code":<status>,"message":"…"}.
package files

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/wire"
)

// Route paths served by the handler New returns.
const (
	FilesPath   = "/files"
	ComposePath = "/files/compose"
)

// handler serves the file routes of one sandbox.
type handler struct {
	sb  *state.Sandbox
	now func() time.Time // clock for signature expiry; replaced in tests
}

// New returns the handler of GET /files, POST /files and POST /files/compose.
// It expects request paths unchanged (not stripped of a prefix); other paths
// get 404 and other methods 405, both in e2b's error shape.
func New(sb *state.Sandbox) http.Handler {
	return &handler{sb: sb, now: time.Now}
}

// ServeHTTP routes a request and answers any error it returns.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var err error
	switch r.URL.Path {
	case FilesPath:
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			err = h.download(w, r)
		case http.MethodPost:
			err = h.upload(w, r)
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			err = statusf(http.StatusMethodNotAllowed, "method %s is not allowed on %s", r.Method, FilesPath)
		}
	case ComposePath:
		if r.Method == http.MethodPost {
			err = h.compose(w, r)
		} else {
			w.Header().Set("Allow", "POST")
			err = statusf(http.StatusMethodNotAllowed, "method %s is not allowed on %s", r.Method, ComposePath)
		}
	default:
		err = statusf(http.StatusNotFound, "route %s not found", r.URL.Path)
	}
	if err != nil {
		writeError(w, err)
	}
}

// httpError is an error with the HTTP status and message it is answered with.
type httpError struct {
	status  int
	message string
	err     error // cause, may be nil
}

func (e *httpError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("%d %s: %v", e.status, e.message, e.err)
	}
	return fmt.Sprintf("%d %s", e.status, e.message)
}

func (e *httpError) Unwrap() error { return e.err }

// statusf returns an error answered with status and the formatted message.
func statusf(status int, format string, args ...any) error {
	return &httpError{status: status, message: fmt.Sprintf(format, args...)}
}

// withStatus returns err answered with status and message.
func withStatus(status int, err error, message string) error {
	return &httpError{status: status, message: message, err: err}
}

// noSpaceMessage is e2b envd's text for a full disk (507).
const noSpaceMessage = "not enough disk space available"

// noSpace reports whether err says the disk or the user's quota is full.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// fsError classifies a filesystem error of an operation on path.
func fsError(err error, what string) error {
	switch {
	case noSpace(err):
		return withStatus(http.StatusInsufficientStorage, err, noSpaceMessage)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ELOOP):
		return withStatus(http.StatusBadRequest, err, fmt.Sprintf("%s: %v", what, err))
	case errors.Is(err, fs.ErrNotExist):
		return withStatus(http.StatusNotFound, err, fmt.Sprintf("%s: %v", what, err))
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return withStatus(http.StatusForbidden, err, fmt.Sprintf("%s: %v", what, err))
	}
	return withStatus(http.StatusInternalServerError, err, fmt.Sprintf("%s: %v", what, err))
}

// writeError answers err; it is the one place the routes write errors.
func writeError(w http.ResponseWriter, err error) {
	var he *httpError
	switch {
	case errors.As(err, &he) && he.status != http.StatusInternalServerError:
		wire.WriteError(w, he.status, he.message)
	case noSpace(err):
		wire.WriteError(w, http.StatusInsufficientStorage, noSpaceMessage)
	case he != nil:
		wire.WriteError(w, he.status, he.message)
	default:
		wire.WriteError(w, http.StatusInternalServerError, err.Error())
	}
}

// writeJSON answers 200 with v encoded as JSON.
func writeJSON(w http.ResponseWriter, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	return nil
}
