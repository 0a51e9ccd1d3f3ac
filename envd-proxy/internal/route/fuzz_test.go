package route

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// checkTarget holds for every target Resolve returns: an ID of [a-z0-9]
// and a port in 1..65535.
func checkTarget(t *testing.T, got Target) {
	t.Helper()
	if got.SandboxID == "" || got.Port == 0 {
		t.Fatalf("accepted an empty target %+v", got)
	}
	for i := range len(got.SandboxID) {
		if c := got.SandboxID[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			t.Fatalf("accepted ID %q", got.SandboxID)
		}
	}
}

// checkErr holds for every error: one of the two kinds, with a message a
// client can read (valid UTF-8, bounded).
func checkErr(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrBadTarget) && !errors.Is(err, ErrNoTarget) {
		t.Fatalf("error of no known kind: %v", err)
	}
	if len(err.Error()) > 1024 {
		t.Fatalf("error message of %d bytes", len(err.Error()))
	}
}

func FuzzResolveHeaders(f *testing.F) {
	for _, s := range [][2]string{
		{"k3x9q2m7v1p8z0c4t7fa", "49983"}, {"abc", "1"}, {"", "49983"}, {"abc", ""}, {"ABC", "80"},
		{"abc", "65536"}, {"abc", "0"}, {"abc", "+80"}, {"abc", " 80"}, {"a\x00b", "80"}, {"ééé", "80"},
		{"abc", "00080"}, {"abc", "1e3"}, {string(make([]byte, 100)), "80"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, id, port string) {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:3002/", nil)
		r.Header[routing.HeaderSandboxID] = []string{id}
		r.Header[routing.HeaderSandboxPort] = []string{port}
		got, err := Resolve(r, nil)
		if err != nil {
			checkErr(t, err)
			if !errors.Is(err, ErrBadTarget) {
				t.Fatalf("headers present, error %v is not ErrBadTarget", err)
			}
			return
		}
		checkTarget(t, got)
		if got.By != ByHeader || got.SandboxID != id {
			t.Fatalf("Resolve(%q, %q) = %+v", id, port, got)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || uint16(p) != got.Port {
			t.Fatalf("port %q read as %d", port, got.Port)
		}
	})
}

func FuzzResolveHost(f *testing.F) {
	for _, s := range []string{
		"49983-k3x9q2m7v1p8z0c4t7fa.example.com", "8080-abc.example.com:443", "sandbox.example.com",
		"127.0.0.1:3002", "[::1]:3002", "-abc.example.com", "80-.example.com", "80-a-b.example.com",
		"99999999999999999999-abc.x", "49983-ABC.x", "", ":", "49983-abc", "49983-abc.:80",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		r, _ := http.NewRequest(http.MethodGet, "http://placeholder/", nil)
		r.Host = host
		got, err := Resolve(r, nil)
		if err != nil {
			checkErr(t, err)
			if utf8.ValidString(host) && !utf8.ValidString(err.Error()) {
				t.Fatalf("error for a valid host is not UTF-8: %q", err.Error())
			}
			return
		}
		checkTarget(t, got)
		if got.By != ByHost {
			t.Fatalf("host %q routed by %s", host, got.By)
		}
	})
}

// FuzzSandboxID checks that an ID the routing accepts splits into the tag
// that sandboxid reads, and that IDs sandboxid makes always route.
func FuzzSandboxID(f *testing.F) {
	for _, s := range []string{"k3x9q2m7v1p8z0c4t7fa", "abc", "", "k3x9q2m7v1p8z0c4t7fA", "k3x9q2m7v1p8z0c4t7fa0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:3002/", nil)
		r.Header.Set(routing.HeaderSandboxID, id)
		r.Header.Set(routing.HeaderSandboxPort, "49983")
		got, err := Resolve(r, nil)
		tag, idErr := sandboxid.Parse(id)
		if idErr == nil {
			if err != nil {
				t.Fatalf("a valid sandbox ID %q does not route: %v", id, err)
			}
			if tag != sandboxid.Tag(got.SandboxID[sandboxid.Len-sandboxid.TagLen:]) {
				t.Fatalf("tag %q of %q", tag, got.SandboxID)
			}
			return
		}
		if err == nil {
			checkTarget(t, got) // [a-z0-9]+ of another length: routed, then refused by the fleet
		}
	})
}

func FuzzTokens(f *testing.F) {
	f.Add("a", "b", "a")
	f.Add("", "x", "")
	f.Fuzz(func(t *testing.T, a, b, probe string) {
		tk := NewTokens(1)
		tk.Learn(a, "sa")
		tk.Learn(b, "sb")
		got, ok := tk.Lookup(probe)
		switch {
		case probe == "":
			if ok {
				t.Fatal("an empty token resolves")
			}
		case probe == b:
			if !ok || got != "sb" {
				t.Fatalf("Lookup(b) = %q, %v", got, ok)
			}
		case probe == a && a != b:
			if ok { // bound 1: a was evicted by b (unless b was empty)
				if b != "" || got != "sa" {
					t.Fatalf("Lookup(a) = %q, %v", got, ok)
				}
			}
		default:
			if ok {
				t.Fatalf("Lookup of an unknown token = %q", got)
			}
		}
		if tk.Len() > 1 {
			t.Fatalf("Len = %d beyond the bound", tk.Len())
		}
	})
}
