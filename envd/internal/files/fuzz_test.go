package files

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// FuzzUploadFilename feeds arbitrary Content-Disposition values through the
// multipart filename → destination path handling.
func FuzzUploadFilename(f *testing.F) {
	for _, seed := range []string{
		`form-data; name="file"; filename="/home/user/x1"`,
		`form-data; name="file"; filename="rel/x2"`,
		`form-data; name="file"; filename="~/a/../../b"`,
		`form-data; name="file"; filename=""`,
		`form-data; name="file"; filename="a\"b"`,
		`form-data; name="file"; filename*=utf-8''%E2%82%AC%00x`,
		`form-data; name="file"; filename="../../../../etc/passwd"`,
		`form-data; name="file"`,
		`form-data; name="file"; filename="a"; filename="b"`,
		"form-data; filename=\"a\x00b\"",
		`attachment; filename=/`,
		``,
	} {
		f.Add(seed)
	}
	u := &identity.User{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}
	f.Fuzz(func(t *testing.T, disposition string) {
		name, err := partFilename(disposition)
		if err != nil {
			return
		}
		if name == "" {
			t.Fatalf("empty filename accepted from %q", disposition)
		}
		p, err := uploadPath(name, u)
		if err != nil {
			return
		}
		switch {
		case strings.ContainsRune(p, 0):
			t.Fatalf("path %q with NUL from %q", p, disposition)
		case !filepath.IsAbs(p) || filepath.Clean(p) != p:
			t.Fatalf("path %q not absolute and clean, from %q", p, disposition)
		case p == "/":
			t.Fatalf("root accepted as a file path from %q", disposition)
		case baseName(p) == "" || baseName(p) == "." || baseName(p) == "..":
			t.Fatalf("path %q has no file name", p)
		}
	})
}

// FuzzAcceptEncoding checks Accept-Encoding parsing never panics and that
// the negotiated coding is acceptable to the client.
func FuzzAcceptEncoding(f *testing.F) {
	for _, seed := range []string{
		"", "gzip", "gzip, deflate, br", "br, identity;q=0", "*;q=0", "gzip;q=0.5, identity;q=0.6",
		"GZIP;Q=1.000", "gzip;q=1.0001", "gzip;q=", ";;;,,,", "identity;q=0, *;q=0.1", "x-gzip;q=0.3",
	} {
		f.Add(seed, false)
	}
	f.Fuzz(func(t *testing.T, header string, preferIdentity bool) {
		accepted := parseAcceptEncoding([]string{header})
		for coding, q := range accepted {
			if q < 0 || q > 1000 || coding == "" || strings.ToLower(coding) != coding {
				t.Fatalf("parsed %q → %q=%d", header, coding, q)
			}
		}
		got := negotiateEncoding([]string{header}, preferIdentity)
		switch got {
		case encodingIdentity:
			if q, ok := accepted[encodingIdentity]; ok && q == 0 {
				t.Fatalf("identity chosen though excluded by %q", header)
			}
		case encodingGzip:
			q, ok := accepted[encodingGzip]
			if !ok {
				q, ok = accepted["x-gzip"]
			}
			if !ok {
				q, ok = accepted["*"]
			}
			if !ok || q == 0 {
				t.Fatalf("gzip chosen though not accepted by %q", header)
			}
		case "":
			if len(accepted) == 0 {
				t.Fatalf("406 for an empty or malformed header %q", header)
			}
		default:
			t.Fatalf("unexpected coding %q", got)
		}
	})
}
