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

// errUnauthorized answers a request without valid credentials on the
// routes e2b envd's middleware guards (/files/compose).
var errUnauthorized = &httpError{status: http.StatusUnauthorized, message: unauthorizedMessage}

// headerMismatchMessage is e2b envd's answer on /files to an X-Access-Token
// that is not the sandbox's.
const headerMismatchMessage = "access token present in header but does not match"

// authorize checks the credentials of a /files request for op, with e2b
// envd's answers (its validateSigning): with a token set, a non-empty
// X-Access-Token header must match it (a wrong header is not rescued by a
// signature); without the header, the URL must carry a valid, unexpired
// signature, else 401 with filesig.Check's message.
func (h *handler) authorize(r *http.Request, op string) error {
	token := h.sb.Token()
	if token == "" {
		return nil
	}
	if presented := r.Header.Get(wire.AccessTokenHeader); presented != "" {
		if h.sb.CheckToken(presented) {
			return nil
		}
		return &httpError{status: http.StatusUnauthorized, message: headerMismatchMessage}
	}
	if err := filesig.Check(r.URL.Query(), op, token, h.now()); err != nil {
		return &httpError{status: http.StatusUnauthorized, message: err.Error()}
	}
	return nil
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
