package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/wire"
)

// authenticate lets a request through when it carries the shared token
// (RPCs: `Authorization: Bearer` or wire.NodeTokenHeader; relayed
// requests: wire.NodeTokenHeader only, since their Authorization belongs to
// the sandbox). Without a token every request passes: mTLS already
// verified the caller, or --insecure-no-auth said so. wire.NodeTokenHeader
// never reaches the next handler.
func (s *Server) authenticate(next http.Handler, relayed func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isRelay := relayed(r)
		nodeToken := r.Header.Get(wire.NodeTokenHeader)
		if _, ok := r.Header[wire.NodeTokenHeader]; ok {
			r = r.WithContext(r.Context()) // a shallow copy whose headers may change
			r.Header = r.Header.Clone()
			r.Header.Del(wire.NodeTokenHeader)
		}
		if s.token != nil {
			ok := s.tokenMatches(nodeToken)
			if !ok && !isRelay {
				bearer, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				ok = found && s.tokenMatches(strings.TrimSpace(bearer))
			}
			if !ok {
				s.unauthorized(w, r, isRelay)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// tokenMatches compares in constant time, lengths included (it compares
// digests).
func (s *Server) tokenMatches(got string) bool {
	if got == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256(s.token)
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

var errUnauthenticated = errors.New("missing or wrong node token: send 'Authorization: Bearer <token>' or '" + wire.NodeTokenHeader + ": <token>'")

// unauthorized answers 401 in the protocol's own shape: a Connect error for
// an RPC, e2b's JSON for a relayed request.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, isRelay bool) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sandboxd"`)
	if ew := connect.NewErrorWriter(); !isRelay && ew.IsSupported(r) {
		_ = ew.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errUnauthenticated))
		return
	}
	wire.WriteError(w, http.StatusUnauthorized, errUnauthenticated.Error())
}
