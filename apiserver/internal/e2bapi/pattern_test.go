package e2bapi

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// RoutePattern names the route, never the path: a sandbox ID never becomes
// a metric label.
func TestRoutePattern(t *testing.T) {
	_, h := newTestServer(t)
	rp, ok := h.(interface{ RoutePattern(*http.Request) string })
	if !ok {
		t.Fatalf("the handler New returns (%T) has no RoutePattern", h)
	}
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodGet, "/health", "GET /health"},
		{http.MethodPost, "/v2/sandboxes", "POST /v2/sandboxes"},
		{http.MethodGet, "/sandboxes/abcdefghij0123456789", "GET /sandboxes/{id}"},
		{http.MethodHead, "/sandboxes/abcdefghij0123456789", "GET /sandboxes/{id}"},
		{http.MethodPost, "/sandboxes/abcdefghij0123456789/pause", "POST /sandboxes/{id}/pause"},
		{http.MethodGet, "/volumes/v1", "GET /volumes/{volumeID}"}, // a 501 route is a route
		{http.MethodGet, "/no/such/route", ""},
		{http.MethodPut, "/v2/sandboxes", ""},           // 405
		{http.MethodGet, "/sandboxes/a/../b", ""},       // not clean: 404
		{http.MethodGet, "//sandboxes", ""},             // not clean: 404
		{"BREW", "/sandboxes/abcdefghij0123456789", ""}, // no such method
	} {
		r := httptest.NewRequest(tc.method, "http://api"+tc.path, nil)
		r.URL.Path = tc.path // keep what NewRequest might clean
		if got := rp.RoutePattern(r); got != tc.want {
			t.Errorf("RoutePattern(%s %s) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}
