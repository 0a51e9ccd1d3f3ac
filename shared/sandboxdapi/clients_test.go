package sandboxdapi_test

import (
	"net/http"
	"net/http/httptest"
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
