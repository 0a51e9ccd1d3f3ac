package files

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"

	"github.com/skiff-dev/skiff/envd/internal/identity"
	"github.com/skiff-dev/skiff/wire"
)

// Compose limits.
const (
	maxComposeBody    = 1 << 20
	maxComposeSources = 10000
)

// composeRequest is the body of POST /files/compose.
type composeRequest struct {
	SourcePaths []string `json:"source_paths"`
	Destination string   `json:"destination"`
	Username    *string  `json:"username,omitempty"`
}

// compose serves POST /files/compose: it concatenates the sources into the
// destination (replaced atomically by a new file of the user's), deletes the
// sources and answers the destination as e2b's envd does, in its OpenAPI
// EntryInfo shape: {"name": …, "path": …, "type": "file"}, like an upload's
// entries (not the filesystem service's EntryInfo).
func (h *handler) compose(w http.ResponseWriter, r *http.Request) error {
	if !h.sb.CheckToken(r.Header.Get(wire.AccessTokenHeader)) {
		return errUnauthorized
	}
	var req composeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxComposeBody))
	if err := dec.Decode(&req); err != nil {
		return withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid request body: %v", err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return statusf(http.StatusBadRequest, "invalid request body: data after the JSON object")
	}
	switch {
	case len(req.SourcePaths) == 0:
		return statusf(http.StatusBadRequest, "source_paths must not be empty")
	case len(req.SourcePaths) > maxComposeSources:
		return statusf(http.StatusBadRequest, "source_paths has more than %d paths", maxComposeSources)
	case req.Destination == "":
		return statusf(http.StatusBadRequest, "destination must not be empty")
	}
	name := ""
	if req.Username != nil {
		name = *req.Username
	}
	u, err := h.requestUser(r, name)
	if err != nil {
		return err
	}
	dest, err := uploadPath(req.Destination, u)
	if err != nil {
		return err
	}
	sources := make([]string, len(req.SourcePaths))
	for i, s := range req.SourcePaths {
		if sources[i], err = identity.ResolvePath(s, u); err != nil {
			return withStatus(http.StatusBadRequest, err, fmt.Sprintf("invalid source path %q: %v", s, err))
		}
	}
	// As e2b's envd: every path is checked, opened and removed as root, and
	// the destination and its new directories are the user's.
	if err := checkSources(sources); err != nil {
		return err
	}

	a, err := createDest(dest, u, replacement)
	if err != nil {
		return err
	}
	defer a.abort()
	for _, src := range sources {
		if err := appendFile(a.f, src); err != nil {
			return err
		}
	}
	if err := a.finish(); err != nil {
		return err
	}
	if err := a.commit(); err != nil {
		return err
	}
	if err := removeSources(sources, dest, a.target); err != nil {
		return err
	}
	return writeJSON(w, uploadedEntry{Name: baseName(dest), Path: dest, Type: "file"})
}

// checkSources answers 404 or 400 unless every source is a regular file.
func checkSources(sources []string) error {
	for _, src := range sources {
		fi, err := os.Stat(src)
		if err != nil {
			return pathError("stat", src, err)
		}
		if err := checkRegular(src, fi); err != nil {
			return err
		}
	}
	return nil
}

// appendFile copies the regular file src to the end of dst.
func appendFile(dst *os.File, src string) error {
	f, _, err := openRegular(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(dst, f); err != nil {
		return fsError(err, "copy "+src)
	}
	return nil
}

// removeSources deletes the composed sources, except the destination.
func removeSources(sources []string, dest, target string) error {
	for _, src := range sources {
		if src == dest || src == target {
			continue
		}
		if err := os.Remove(src); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fsError(err, "remove source "+src)
		}
	}
	return nil
}
