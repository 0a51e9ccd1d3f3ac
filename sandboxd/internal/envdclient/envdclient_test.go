package envdclient

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/wire"
)

func TestInit(t *testing.T) {
	var got wire.EnvdInit
	var gotToken string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/init" {
			http.NotFound(w, r)
			return
		}
		gotToken = r.Header.Get(wire.AccessTokenHeader)
		if gotToken == "wrong" {
			wire.WriteError(w, http.StatusUnauthorized, "unauthorized access")
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Envd-Version", "0.6.4")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := New(time.Second)

	tok := "new-token"
	v, err := c.Init(t.Context(), addr, "old-token", &wire.EnvdInit{AccessToken: &tok, EnvVars: map[string]string{"A": "b"}})
	if err != nil || v != "0.6.4" {
		t.Fatalf("Init = %q, %v", v, err)
	}
	if gotToken != "old-token" || got.AccessToken == nil || *got.AccessToken != tok || got.EnvVars["A"] != "b" {
		t.Fatalf("envd got token %q and %+v", gotToken, got)
	}
	if _, err := c.Init(t.Context(), addr, "", &wire.EnvdInit{AccessToken: &tok}); err != nil || gotToken != "" {
		t.Fatalf("first Init sent token %q (%v)", gotToken, err)
	}
	_, err = c.Init(t.Context(), addr, "wrong", &wire.EnvdInit{AccessToken: &tok})
	if !errors.Is(err, ErrEnvd) || !strings.Contains(err.Error(), "status 401: unauthorized access") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("refused Init = %v, want ErrEnvd with envd's message and no token", err)
	}
}

// A version that is not one (a restored sandbox's port answered by its
// tenant's own process) fails the /init rather than reaching the host's
// inventory and the API's answers.
func TestInitRefusesAVersionThatIsNone(t *testing.T) {
	for version, ok := range map[string]bool{
		"0.6.4": true, "0.6.13": true, "1.0.0-rc.1": true, "1.0.0+build.5": true, "": true,
		"banana": false, "0.6": false, "0.6.x": false, "1.2.3-<script>": false,
		strings.Repeat("9", 30) + ".1.1": false, strings.Repeat("1.2.3", 10000): false,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header()["X-Envd-Version"] = []string{version}
			w.WriteHeader(http.StatusNoContent)
		}))
		tok := "t"
		v, err := New(time.Second).Init(t.Context(), strings.TrimPrefix(srv.URL, "http://"), "", &wire.EnvdInit{AccessToken: &tok})
		srv.Close()
		switch {
		case ok && (err != nil || v != version):
			t.Errorf("version %q: Init = %q, %v; want it", version, v, err)
		case !ok && (!errors.Is(err, ErrEnvd) || !strings.Contains(err.Error(), "is not a version") || len(err.Error()) > 200):
			t.Errorf("version %.40q: Init = %q, %v; want a short ErrEnvd that it is not a version", version, v, err)
		}
	}
}

// An answer's headers are held to 64 KiB: a restored sandbox's port may
// be answered by its tenant's process.
func TestInitAnswerHeadersBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Envd-Version", "0.6.4")
		w.Header().Set("X-Padding", strings.Repeat("p", 100<<10))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tok := "t"
	if v, err := New(time.Second).Init(t.Context(), strings.TrimPrefix(srv.URL, "http://"), "", &wire.EnvdInit{AccessToken: &tok}); !errors.Is(err, ErrEnvd) {
		t.Fatalf("an answer with 100 KiB of headers: Init = %q, %v; want ErrEnvd", v, err)
	}
}

func TestWaitHealthy(t *testing.T) {
	var healthy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Swap(true) { // the second try answers
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c := New(time.Second)
	if err := c.WaitHealthy(t.Context(), strings.TrimPrefix(srv.URL, "http://"), 5*time.Second); err != nil {
		t.Fatalf("WaitHealthy = %v", err)
	}
	srv.Close()
	err := c.WaitHealthy(t.Context(), strings.TrimPrefix(srv.URL, "http://"), 20*time.Millisecond)
	if !errors.Is(err, ErrEnvd) || !strings.Contains(err.Error(), "envd did not answer within 20ms") {
		t.Fatalf("WaitHealthy of nothing = %v", err)
	}
}

func TestVersion(t *testing.T) {
	script := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = --version ] && echo 0.6.4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if v, err := Version(t.Context(), script); err != nil || v != "0.6.4" {
		t.Fatalf("Version = %q, %v", v, err)
	}
	if _, err := Version(t.Context(), filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing envd gave a version")
	}
}
