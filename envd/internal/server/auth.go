package server

import (
	"net/http"

	"github.com/skiff-dev/skiff/envd/internal/state"
	"github.com/skiff-dev/skiff/wire"
)

// unauthorizedMessage is e2b envd's text for a missing or wrong token.
const unauthorizedMessage = "unauthorized access, please provide a valid access token or method signing if supported"

// exempt reports whether a route is served without the access token: health,
// init, and /files, which checks the token or a URL signature itself.
func exempt(r *http.Request) bool {
	switch r.URL.Path {
	case "/health":
		return r.Method == http.MethodGet || r.Method == http.MethodHead
	case "/init":
		return r.Method == http.MethodPost
	case "/files":
		return r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodPost
	}
	return false
}

// requireToken answers 401 in e2b's shape to a request without the access
// token, once one is set.
func requireToken(sb *state.Sandbox, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodOptions && !exempt(r) && !sb.CheckToken(r.Header.Get(wire.AccessTokenHeader)) {
			wire.WriteError(w, http.StatusUnauthorized, unauthorizedMessage)
			return
		}
		next.ServeHTTP(w, r)
	})
}
