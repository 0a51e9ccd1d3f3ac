package files

import (
	"errors"
	"net/http"

	"github.com/skiff-dev/skiff/envd/filesig"
	"github.com/skiff-dev/skiff/envd/internal/identity"
	"github.com/skiff-dev/skiff/wire"
)

// unauthorizedMessage is e2b envd's text for a missing or wrong token.
const unauthorizedMessage = "unauthorized access, please provide a valid access token or method signing if supported"

// Signature operations: what a signed URL allows.
const (
	opRead  = filesig.OpRead  // GET /files
	opWrite = filesig.OpWrite // POST /files
)

// Query parameters of /files.
const (
	queryPath     = filesig.QueryPath
	queryUsername = filesig.QueryUsername
)

// errUnauthorized answers a request without valid credentials.
var errUnauthorized = &httpError{status: http.StatusUnauthorized, message: unauthorizedMessage}

// authorize checks the credentials of a /files request for op: with a token
// set, a non-empty X-Access-Token header must match it (as in e2b envd, a
// wrong header is not rescued by a signature); without the header, the URL
// must carry a valid, unexpired signature.
func (h *handler) authorize(r *http.Request, op string) error {
	token := h.sb.Token()
	if token == "" {
		return nil
	}
	if presented := r.Header.Get(wire.AccessTokenHeader); presented != "" {
		if h.sb.CheckToken(presented) {
			return nil
		}
		return errUnauthorized
	}
	if filesig.Verify(r.URL.Query(), op, token, h.now()) {
		return nil
	}
	return errUnauthorized
}

// Signature is filesig.Sign, for this package's tests.
func Signature(path, op, username, token string, expiration *int64) string {
	return filesig.Sign(path, op, username, token, expiration)
}

// requestUser resolves who a request acts as: name when not empty, else the
// username of Basic auth, else the sandbox's default user. An unknown user
// is 401 `invalid username: '<u>'`.
func (h *handler) requestUser(r *http.Request, name string) (*identity.User, error) {
	var u *identity.User
	var err error
	if name == "" {
		u, err = h.sb.RequestUser(r.Header)
	} else {
		u, err = h.sb.User(name)
	}
	switch {
	case errors.Is(err, identity.ErrUnknownUser):
		return nil, withStatus(http.StatusUnauthorized, err, err.Error())
	case err != nil:
		return nil, withStatus(http.StatusInternalServerError, err, "resolve user: "+err.Error())
	}
	return u, nil
}
