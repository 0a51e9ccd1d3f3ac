package identity

import (
	"encoding/base64"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

var home = &User{Name: "user", Home: "/home/user"}

func TestResolvePath(t *testing.T) {
	for _, tc := range []struct{ in, want, wantErr string }{
		{"/etc/hostname", "/etc/hostname", ""},
		{"rel/x", "/home/user/rel/x", ""},
		{"~", "/home/user", ""},
		{"~/a/../b", "/home/user/b", ""},
		{"/a//b/./c/", "/a/b/c", ""},
		{"../../etc", "/etc", ""},
		// Another user's home is refused, as e2b's envd refuses it.
		{"~other", "", "cannot expand user-specific home dir"},
		{"~other/x", "", "cannot expand user-specific home dir"},
		{"~\\x", "/home/user/\\x", ""},
		{"a/~other", "/home/user/a/~other", ""},
		{"", "", "empty"},
		{"a\x00b", "", "NUL"},
	} {
		got, err := ResolvePath(tc.in, home)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ResolvePath(%q) = %q, %v; want an error about %s", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ResolvePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// For a request that only reads, an empty path is the default workdir
// (resolved as any path), else the home; any other path resolves as for
// ResolvePath.
func TestResolveReadPath(t *testing.T) {
	for _, tc := range []struct{ in, workdir, want string }{
		{"", "", "/home/user"},
		{"", "/srv/app", "/srv/app"},
		{"", "proj", "/home/user/proj"},
		{"", "~/proj/", "/home/user/proj"},
		{"x", "/srv/app", "/home/user/x"},
		{"/etc", "/srv/app", "/etc"},
	} {
		if got, err := ResolveReadPath(tc.in, home, tc.workdir); err != nil || got != tc.want {
			t.Errorf("ResolveReadPath(%q, workdir %q) = %q, %v; want %q", tc.in, tc.workdir, got, err, tc.want)
		}
	}
	if _, err := ResolveReadPath("~other", home, ""); err == nil {
		t.Error("ResolveReadPath(~other) resolved")
	}
}

func TestBasicUsername(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct{ header, want string }{
		{"", ""},
		{"Basic " + b64("root:"), "root"},
		{"basic " + b64("user:ignored"), "user"},
		// As e2b's envd (Go's BasicAuth): anything else is no username,
		// and the request acts as the default user.
		{"Basic " + b64("nocolon"), ""},
		{"Bearer abc", ""},
		{"Basic !!!", ""},
		{"Basic", ""},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Authorization", tc.header)
		}
		if got := BasicUsername(h); got != tc.want {
			t.Errorf("BasicUsername(%q) = %q, want %q", tc.header, got, tc.want)
		}
	}
}

func TestLookup(t *testing.T) {
	u, err := Lookup("root")
	if err != nil || u.UID != 0 || u.Home != "/root" {
		t.Fatalf("Lookup(root) = %+v, %v", u, err)
	}
	if _, err := Lookup("no-such-user-here"); !errors.Is(err, ErrUnknownUser) || !strings.Contains(err.Error(), "invalid username: 'no-such-user-here'") {
		t.Fatalf("Lookup(unknown) = %v", err)
	}
}

// A resolved path is absolute and clean, or an error: never a panic, never a
// relative path.
func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"/a", "rel", "~", "~/x", "../..", "", "a\x00", "//", "~user/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := ResolvePath(p, home)
		if err != nil {
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("ResolvePath(%q) = %q, not absolute and clean", p, got)
		}
	})
}

func FuzzBasicUsername(f *testing.F) {
	for _, s := range []string{"Basic cm9vdDo=", "Basic", "Basic =", "Bearer x", "basic dXNlcjo6Og=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		h := http.Header{}
		h.Set("Authorization", header)
		if name := BasicUsername(h); strings.Contains(name, ":") {
			t.Fatalf("BasicUsername(%q) = %q, contains the password separator", header, name)
		}
	})
}
