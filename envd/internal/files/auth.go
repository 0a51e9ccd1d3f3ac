package files

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/skiff-dev/skiff/envd/internal/identity"
)

// AccessTokenHeader carries the sandbox's access token.
const AccessTokenHeader = "X-Access-Token"

// unauthorizedMessage is e2b envd's text for a missing or wrong token.
const unauthorizedMessage = "unauthorized access, please provide a valid access token or method signing if supported"

// Signature operations: what a signed URL allows.
const (
	opRead  = "read"  // GET /files
	opWrite = "write" // POST /files
)

// Query parameters of /files.
const (
	queryPath       = "path"
	queryUsername   = "username"
	querySignature  = "signature"
	queryExpiration = "signature_expiration"
)

// signaturePrefix versions the URL signature scheme.
const signaturePrefix = "v1_"

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
	if presented := r.Header.Get(AccessTokenHeader); presented != "" {
		if h.sb.CheckToken(presented) {
			return nil
		}
		return errUnauthorized
	}
	if verifySignature(r.URL.Query(), op, token, h.now()) {
		return nil
	}
	return errUnauthorized
}

// Signature returns the URL signature e2b's SDKs compute for op on path as
// username ("" when the URL names none), valid until expiration (unix
// seconds; nil for a signature that does not expire).
func Signature(path, op, username, token string, expiration *int64) string {
	payload := path + ":" + op + ":" + username + ":" + token
	if expiration != nil {
		payload += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(payload))
	return signaturePrefix + base64.RawStdEncoding.EncodeToString(sum[:])
}

// verifySignature reports whether q carries exactly one signature valid for
// op on q's path and username under token, and unexpired at now. Anything
// not exactly valid (repeated or non-canonical parameters) is rejected.
func verifySignature(q url.Values, op, token string, now time.Time) bool {
	sigs := q[querySignature]
	if len(sigs) != 1 || token == "" {
		return false
	}
	var expiration *int64
	if exps, ok := q[queryExpiration]; ok {
		if len(exps) != 1 {
			return false
		}
		exp, err := strconv.ParseInt(exps[0], 10, 64)
		if err != nil || strconv.FormatInt(exp, 10) != exps[0] || exp < now.Unix() {
			return false
		}
		expiration = &exp
	}
	want := Signature(q.Get(queryPath), op, q.Get(queryUsername), token, expiration)
	return subtle.ConstantTimeCompare([]byte(want), []byte(sigs[0])) == 1
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
