package files

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/asuser/asusertest"
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

// TestUploadAsUserIsCheckedAsTheUser: an upload acting as an unprivileged
// user can write only what that user could, whatever symlinks the user
// planted; what it creates is the user's, and a file it overwrites keeps its
// owner and mode.
func TestUploadAsUserIsCheckedAsTheUser(t *testing.T) {
	for _, tc := range []struct {
		name string
		form string
		path func(tr *asusertest.Tree) string
		// ok: the upload succeeds and check verifies the result; else it
		// is refused as the user's own write would be (403) and nothing of
		// root's changes.
		ok    bool
		check func(t *testing.T, tr *asusertest.Tree, p string)
	}{
		{name: "link to root's 0600 file", form: "octet", path: func(tr *asusertest.Tree) string { return tr.LinkSecret }},
		{name: "link to root's 0600 file, multipart", form: "multipart", path: func(tr *asusertest.Tree) string { return tr.LinkSecret }},
		{name: "link to root's 0644 file", form: "filename", path: func(tr *asusertest.Tree) string { return tr.LinkPublic }},
		{name: "link to root's 0644 file, gzip", form: "gzip", path: func(tr *asusertest.Tree) string { return tr.LinkPublic }},
		{name: "root's 0644 file itself", form: "octet", path: func(tr *asusertest.Tree) string { return tr.Public }},
		{name: "new file through a link to root's directory", form: "gzip", path: func(tr *asusertest.Tree) string { return filepath.Join(tr.LinkDir, "new.txt") }},
		{name: "new parents through a link to root's directory", form: "filename", path: func(tr *asusertest.Tree) string { return filepath.Join(tr.LinkDir, "a/b/new.txt") }},
		{name: "into a directory the user cannot enter", form: "multipart", path: func(tr *asusertest.Tree) string { return filepath.Join(tr.Private, "new.txt") }},
		{name: "over a file in a directory the user cannot enter", form: "octet", path: func(tr *asusertest.Tree) string { return tr.Hidden }},
		{
			name: "new file and parents in the home", form: "filename", ok: true,
			path: func(tr *asusertest.Tree) string { return filepath.Join(tr.Home, "new/deeper/file.txt") },
			check: func(t *testing.T, tr *asusertest.Tree, p string) {
				u := tr.User
				asusertest.CheckFile(t, p, "uploaded", u.UID, u.GID, 0o644)
				asusertest.CheckOwner(t, filepath.Join(tr.Home, "new"), u.UID, u.GID)
				asusertest.CheckOwner(t, filepath.Join(tr.Home, "new/deeper"), u.UID, u.GID)
				asusertest.CheckOwner(t, tr.Home, u.UID, u.GID)
			},
		},
		{
			name: "overwrite the user's own file", form: "gzip", ok: true,
			path: func(tr *asusertest.Tree) string { return tr.Mine },
			check: func(t *testing.T, tr *asusertest.Tree, p string) {
				asusertest.CheckFile(t, p, "uploaded", tr.User.UID, tr.User.GID, 0o640)
			},
		},
		{
			name: "overwrite root's file the user's group may write", form: "multipart", ok: true,
			path: func(tr *asusertest.Tree) string { return tr.Shared },
			check: func(t *testing.T, tr *asusertest.Tree, p string) {
				asusertest.CheckFile(t, p, "uploaded", 0, tr.User.GID, 0o664)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := asusertest.New(t)
			h, _ := newHandler(t, "")
			p := tc.path(tr)
			rec := do(h, uploadAs(t, tc.form, tr.User.Name, p, "uploaded"))
			if tc.ok {
				entries := uploadResult(t, rec)
				if len(entries) != 1 || entries[0].Path != p {
					t.Errorf("entries = %+v, want one for %s", entries, p)
				}
				tc.check(t, tr, p)
			} else {
				wantError(t, rec, http.StatusForbidden, "permission denied")
			}
			tr.CheckUntouched(t)
			asusertest.CheckFile(t, tr.Mine, map[bool]string{true: "uploaded", false: asusertest.MineContent}[p == tr.Mine], tr.User.UID, tr.User.GID, 0o640)
		})
	}
}

// TestDownloadAsUserIsCheckedAsTheUser: a download acting as an
// unprivileged user reads only what that user could.
func TestDownloadAsUserIsCheckedAsTheUser(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(tr *asusertest.Tree) string
		want string // "" for a refusal (403)
	}{
		{"link to root's 0600 file", func(tr *asusertest.Tree) string { return tr.LinkSecret }, ""},
		{"root's 0600 file itself", func(tr *asusertest.Tree) string { return tr.Secret }, ""},
		{"a file in a directory the user cannot enter", func(tr *asusertest.Tree) string { return tr.Hidden }, ""},
		{"link to root's 0644 file", func(tr *asusertest.Tree) string { return tr.LinkPublic }, asusertest.PublicContent},
		{"the user's own file", func(tr *asusertest.Tree) string { return tr.Mine }, asusertest.MineContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := asusertest.New(t)
			h, _ := newHandler(t, "")
			rec := do(h, httptest.NewRequest(http.MethodGet, filesURL("/files", "path", tc.path(tr), "username", tr.User.Name), nil))
			if tc.want == "" {
				wantError(t, rec, http.StatusForbidden, "permission denied")
				return
			}
			if rec.Code != http.StatusOK || rec.Body.String() != tc.want {
				t.Fatalf("status %d body %q, want 200 %q", rec.Code, rec.Body, tc.want)
			}
		})
	}
}

// TestComposeAsUserIsCheckedAsTheUser: compose reads, writes and deletes
// only what the user could.
func TestComposeAsUserIsCheckedAsTheUser(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources func(tr *asusertest.Tree) []string
		dest    func(tr *asusertest.Tree) string
		ok      bool
	}{
		{
			name:    "source through a link to root's 0600 file",
			sources: func(tr *asusertest.Tree) []string { return []string{tr.Mine, tr.LinkSecret} },
			dest:    func(tr *asusertest.Tree) string { return filepath.Join(tr.Home, "joined") },
		},
		{
			name:    "destination through a link to root's 0644 file",
			sources: func(tr *asusertest.Tree) []string { return []string{tr.Mine} },
			dest:    func(tr *asusertest.Tree) string { return tr.LinkPublic },
		},
		{
			name:    "destination in root's directory",
			sources: func(tr *asusertest.Tree) []string { return []string{tr.Mine} },
			dest:    func(tr *asusertest.Tree) string { return filepath.Join(tr.LinkDir, "joined") },
		},
		{
			name:    "in the home",
			sources: func(tr *asusertest.Tree) []string { return []string{tr.Mine} },
			dest:    func(tr *asusertest.Tree) string { return filepath.Join(tr.Home, "sub/joined") },
			ok:      true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := asusertest.New(t)
			h, _ := newHandler(t, "")
			dest := tc.dest(tr)
			body, err := json.Marshal(map[string]any{"source_paths": tc.sources(tr), "destination": dest, "username": tr.User.Name})
			if err != nil {
				t.Fatal(err)
			}
			rec := do(h, httptest.NewRequest(http.MethodPost, "/files/compose", bytes.NewReader(body)))
			if tc.ok {
				if rec.Code != http.StatusOK {
					t.Fatalf("status %d body %s", rec.Code, rec.Body)
				}
				asusertest.CheckFile(t, dest, asusertest.MineContent, tr.User.UID, tr.User.GID, 0o644)
				asusertest.CheckOwner(t, filepath.Dir(dest), tr.User.UID, tr.User.GID)
			} else {
				wantError(t, rec, http.StatusForbidden, "permission denied")
				asusertest.CheckFile(t, tr.Mine, asusertest.MineContent, tr.User.UID, tr.User.GID, 0o640)
			}
			tr.CheckUntouched(t)
			assertNoTempFiles(t, tr.Home)
		})
	}
}
