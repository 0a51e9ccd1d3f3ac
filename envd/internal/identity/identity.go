// Package identity resolves who an envd request acts as: the Unix user named
// by HTTP Basic auth (or the username query of /files), falling back to the
// sandbox's default user, and the paths that user's relative paths resolve
// against.
package identity

import (
	"errors"
	"fmt"
	"net/http"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrUnknownUser is returned for a username that does not exist in the
// sandbox; envd answers it with unauthenticated (RPCs) or 401 (HTTP routes).
var ErrUnknownUser = errors.New("invalid username")

// User is a resolved Unix user.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
	Home   string
}

// Lookup resolves a username.
func Lookup(name string) (*User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: '%s'", ErrUnknownUser, name)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", name, u.Gid, err)
	}
	out := &User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil && uint32(g) != out.GID {
				out.Groups = append(out.Groups, uint32(g))
			}
		}
	}
	if out.Home == "" {
		out.Home = "/"
	}
	return out, nil
}

// BasicUsername returns the username of an `Authorization: Basic` header
// (envd reads only the username; the SDKs send an empty password), or ""
// when there is none: as e2b's envd (Go's Request.BasicAuth), a header of
// another scheme, or a malformed one, is no username, and the request acts
// as the default user.
func BasicUsername(h http.Header) string {
	name, _, _ := (&http.Request{Header: h}).BasicAuth()
	return name
}

// ResolvePath turns a request path into an absolute, clean path for u:
// "~" and "~/x" expand to u's home, and a relative path resolves against it.
// "~other/x" (another user's home) is an error, as with e2b's envd, not a
// folder named "~other" in u's home. An empty path is an error: see
// ResolveReadPath for the requests that take one.
func ResolvePath(p string, u *User) (string, error) {
	if p == "" {
		return "", errors.New("path is empty")
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("path contains a NUL byte")
	}
	switch {
	case p == "~":
		p = u.Home
	case p[0] == '~' && p[1] != '/' && p[1] != '\\':
		return "", errors.New("cannot expand user-specific home dir")
	case p[0] == '~':
		p = filepath.Join(u.Home, p[1:])
	case !filepath.IsAbs(p):
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p), nil
}

// ResolveReadPath is ResolvePath for a request that only reads (Stat,
// ListDir, a watch, a download): there, an empty path means the sandbox's
// default workdir (resolved for u), else u's home, as with e2b's envd.
// Requests that change anything keep refusing it: e2b's would remove or
// overwrite the home.
func ResolveReadPath(p string, u *User, workdir string) (string, error) {
	if p == "" {
		if workdir == "" {
			return filepath.Clean(u.Home), nil
		}
		p = workdir
	}
	return ResolvePath(p, u)
}
