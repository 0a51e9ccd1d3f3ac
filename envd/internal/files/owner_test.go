package files

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/ensure/ensuretest"
)

// uploadAs builds a POST /files acting as user in one of the body forms the
// SDKs send: "octet", "gzip" (octet-stream, Content-Encoding: gzip),
// "multipart" (path in the query) or "filename" (multipart, path as the
// part's filename).
func uploadAs(t *testing.T, form, user, p, content string) *http.Request {
	t.Helper()
	var body io.Reader
	var ct string
	query := []string{"path", p, "username", user}
	switch form {
	case "octet":
		body, ct = strings.NewReader(content), "application/octet-stream"
	case "gzip":
		body, ct = bytes.NewReader(gzipBytes(t, content)), "application/octet-stream"
	case "multipart":
		body, ct = multipartBody(t, part{"file", "ignored", content})
	case "filename":
		body, ct = multipartBody(t, part{"file", p, content})
		query = []string{"username", user}
	default:
		t.Fatalf("unknown upload form %q", form)
	}
	req := httptest.NewRequest(http.MethodPost, filesURL("/files", query...), body)
	req.Header.Set("Content-Type", ct)
	if form == "gzip" {
		req.Header.Set("Content-Encoding", "gzip")
	}
	return req
}

// TestUploadAsUserActsAsRoot: an upload acting as an unprivileged user
// writes as e2b's envd does, as root, wherever root may (the SDK's own tests
// write /0/file as user): what it creates is the user's, parents included,
// and a file it writes becomes the user's, keeping its mode.
func TestUploadAsUserActsAsRoot(t *testing.T) {
	for _, tc := range []struct {
		name string
		form string
		path func(tr *ensuretest.Tree) string
		// mode is the written file's; dirs are the new directories, which
		// must be the user's.
		mode  fs.FileMode
		check func(t *testing.T, tr *ensuretest.Tree, p string)
	}{
		{name: "through a link to root's 0600 file", form: "octet", path: func(tr *ensuretest.Tree) string { return tr.LinkSecret }, mode: 0o600,
			check: func(t *testing.T, tr *ensuretest.Tree, _ string) {
				ensuretest.CheckFile(t, tr.Secret, "uploaded", tr.User.UID, tr.User.GID, 0o600)
			}},
		{name: "root's 0644 file itself", form: "multipart", path: func(tr *ensuretest.Tree) string { return tr.Public }, mode: 0o644},
		{name: "root's file the user's group may write", form: "filename", path: func(tr *ensuretest.Tree) string { return tr.Shared }, mode: 0o664},
		{name: "a new file through a link to root's directory", form: "gzip", path: func(tr *ensuretest.Tree) string { return filepath.Join(tr.LinkDir, "new.txt") }, mode: 0o644,
			check: func(t *testing.T, tr *ensuretest.Tree, _ string) {
				ensuretest.CheckFile(t, filepath.Join(tr.RootDir, "new.txt"), "uploaded", tr.User.UID, tr.User.GID, 0o644)
				ensuretest.CheckOwner(t, tr.RootDir, 0, 0)
			}},
		{name: "new parents in a directory the user cannot enter", form: "filename", path: func(tr *ensuretest.Tree) string { return filepath.Join(tr.Private, "a/b/new.txt") }, mode: 0o644,
			check: func(t *testing.T, tr *ensuretest.Tree, _ string) {
				ensuretest.CheckOwner(t, filepath.Join(tr.Private, "a"), tr.User.UID, tr.User.GID)
				ensuretest.CheckOwner(t, filepath.Join(tr.Private, "a/b"), tr.User.UID, tr.User.GID)
				ensuretest.CheckOwner(t, tr.Private, 0, 0)
			}},
		{name: "new file and parents in the home", form: "filename", path: func(tr *ensuretest.Tree) string { return filepath.Join(tr.Home, "new/deeper/file.txt") }, mode: 0o644,
			check: func(t *testing.T, tr *ensuretest.Tree, _ string) {
				ensuretest.CheckOwner(t, filepath.Join(tr.Home, "new"), tr.User.UID, tr.User.GID)
				ensuretest.CheckOwner(t, filepath.Join(tr.Home, "new/deeper"), tr.User.UID, tr.User.GID)
			}},
		{name: "the user's own file", form: "gzip", path: func(tr *ensuretest.Tree) string { return tr.Mine }, mode: 0o640},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := ensuretest.New(t)
			h, _ := newHandler(t, "")
			p := tc.path(tr)
			entries := uploadResult(t, do(h, uploadAs(t, tc.form, tr.User.Name, p, "uploaded")))
			if len(entries) != 1 || entries[0].Path != p {
				t.Errorf("entries = %+v, want one for %s", entries, p)
			}
			target, err := filepath.EvalSymlinks(p)
			if err != nil {
				t.Fatal(err)
			}
			ensuretest.CheckFile(t, target, "uploaded", tr.User.UID, tr.User.GID, tc.mode)
			if tc.check != nil {
				tc.check(t, tr, p)
			}
		})
	}
}

// TestUploadAsRootOverAUsersFile: as in e2b's envd, a file root writes is
// root's afterwards, whoever had it.
func TestUploadAsRootOverAUsersFile(t *testing.T) {
	tr := ensuretest.New(t)
	h, _ := newHandler(t, "")
	uploadResult(t, do(h, uploadAs(t, "octet", "root", tr.Mine, "root's now")))
	ensuretest.CheckFile(t, tr.Mine, "root's now", 0, 0, 0o640)
}

// TestDownloadAsUserActsAsRoot: a download acting as an unprivileged user
// reads as e2b's envd does, as root.
func TestDownloadAsUserActsAsRoot(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(tr *ensuretest.Tree) string
		want string
	}{
		{"link to root's 0600 file", func(tr *ensuretest.Tree) string { return tr.LinkSecret }, ensuretest.SecretContent},
		{"a file in a directory the user cannot enter", func(tr *ensuretest.Tree) string { return tr.Hidden }, ensuretest.HiddenContent},
		{"the user's own file", func(tr *ensuretest.Tree) string { return tr.Mine }, ensuretest.MineContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := ensuretest.New(t)
			h, _ := newHandler(t, "")
			rec := do(h, httptest.NewRequest(http.MethodGet, filesURL("/files", "path", tc.path(tr), "username", tr.User.Name), nil))
			if rec.Code != http.StatusOK || rec.Body.String() != tc.want {
				t.Fatalf("status %d body %q, want 200 %q", rec.Code, rec.Body, tc.want)
			}
			tr.CheckUntouched(t)
		})
	}
}

// TestComposeAsUserActsAsRoot: compose reads its sources and writes its
// destination as root, and the destination and its new parents are the
// user's.
func TestComposeAsUserActsAsRoot(t *testing.T) {
	tr := ensuretest.New(t)
	h, _ := newHandler(t, "")
	dest := filepath.Join(tr.Private, "sub", "joined")
	body, err := json.Marshal(map[string]any{"source_paths": []string{tr.Mine, tr.LinkSecret}, "destination": dest, "username": tr.User.Name})
	if err != nil {
		t.Fatal(err)
	}
	rec := do(h, httptest.NewRequest(http.MethodPost, "/files/compose", bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d body %s", rec.Code, rec.Body)
	}
	ensuretest.CheckFile(t, dest, ensuretest.MineContent+ensuretest.SecretContent, tr.User.UID, tr.User.GID, 0o644)
	ensuretest.CheckOwner(t, filepath.Dir(dest), tr.User.UID, tr.User.GID)
	assertNoTempFiles(t, filepath.Dir(dest))
}
