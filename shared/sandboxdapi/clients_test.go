package sandboxdapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// TestNewClients proves the clients send the bearer token over http:// to
// the endpoint, and that there is one client per endpoint.
func TestNewClients(t *testing.T) {
	var (
		mu    sync.Mutex
		auths []string
		paths []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	endpoint := strings.TrimPrefix(srv.URL, "http://")

	clients := sandboxdapi.NewClients("s3cret", srv.Client())
	c := clients(endpoint)
	if clients(endpoint) != c {
		t.Error("a second client for the same endpoint, want the cached one")
	}
	_, err := c.Info(t.Context(), connect.NewRequest(&sandboxdv1.InfoRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Info = %v, want the server's unauthenticated", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auths) != 1 || auths[0] != "Bearer s3cret" || paths[0] != "/skiff.sandboxd.v1.SandboxdService/Info" {
		t.Fatalf("server saw Authorization %q on %q, want one call with Bearer s3cret on Info", auths, paths)
	}
}

// TestNewNodeClients proves each node's client sends that node's token,
// also when two nodes name one endpoint (a host naming another's address
// gets its own token sent there, not the other host's).
func TestNewNodeClients(t *testing.T) {
	var (
		mu    sync.Mutex
		auths []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	endpoint := strings.TrimPrefix(srv.URL, "http://")

	clients := sandboxdapi.NewNodeClients(func(node string) string { return "token-of-" + node }, srv.Client())
	a, b := clients("host-a", endpoint), clients("host-b", endpoint)
	if a == b || clients("host-a", endpoint) != a {
		t.Error("want one cached client per node and endpoint")
	}
	for _, c := range []interface {
		Info(ctx context.Context, req *connect.Request[sandboxdv1.InfoRequest]) (*connect.Response[sandboxdv1.InfoResponse], error)
	}{a, b} {
		if _, err := c.Info(t.Context(), connect.NewRequest(&sandboxdv1.InfoRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("Info = %v, want the server's unauthenticated", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"Bearer token-of-host-a", "Bearer token-of-host-b"}; !slices.Equal(auths, want) {
		t.Fatalf("server saw Authorization %q, want %q", auths, want)
	}
}
