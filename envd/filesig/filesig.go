// Package filesig is the URL signature of envd's /files routes, which e2b's
// SDKs compute from a sandbox's access token so that a URL (a download
// link) authorizes one read or write without the token itself:
//
//	signature = "v1_" + base64(sha256(path ":" op ":" username ":" token [":" expiration]))
//
// envd checks it, and sandboxd's relay checks it too before it wakes a
// paused sandbox for such a URL. It is a package of its own, outside envd's
// internals, for that second reader; it imports only the standard library.
package filesig

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/url"
	"strconv"
	"time"
)

// Operations a signature allows.
const (
	OpRead  = "read"  // GET /files
	OpWrite = "write" // POST /files
)

// Query parameters of a signed /files URL.
const (
	QueryPath       = "path"
	QueryUsername   = "username"
	QuerySignature  = "signature"
	QueryExpiration = "signature_expiration"
)

// prefix versions the scheme.
const prefix = "v1_"

// Sign returns the signature e2b's SDKs compute for op on path as username
// ("" when the URL names none), valid until expiration (unix seconds; nil
// for a signature that does not expire).
func Sign(path, op, username, token string, expiration *int64) string {
	payload := path + ":" + op + ":" + username + ":" + token
	if expiration != nil {
		payload += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(payload))
	return prefix + base64.RawStdEncoding.EncodeToString(sum[:])
}

// Errors of Check: e2b envd's own messages (e2b-dev/infra,
// packages/envd/internal/api/auth.go, validateSigning), which it answers
// with 401.
var (
	ErrMissing = errors.New("missing signature query parameter")
	ErrInvalid = errors.New("invalid signature")
	ErrExpired = errors.New("signature is already expired")
)

// Check says whether q carries exactly one signature valid for op on q's
// path and username under token, unexpired at now: nil, else ErrMissing
// (no signature), ErrInvalid (a signature that is not exactly valid:
// repeated or non-canonical parameters, another path, user, operation or
// expiration, or any signature when token is empty) or ErrExpired (a valid
// signature past its expiration), in e2b envd's order.
func Check(q url.Values, op, token string, now time.Time) error {
	sigs, ok := q[QuerySignature]
	if !ok {
		return ErrMissing
	}
	if len(sigs) != 1 || token == "" {
		return ErrInvalid
	}
	var expiration *int64
	if exps, ok := q[QueryExpiration]; ok {
		if len(exps) != 1 {
			return ErrInvalid
		}
		exp, err := strconv.ParseInt(exps[0], 10, 64)
		if err != nil || strconv.FormatInt(exp, 10) != exps[0] {
			return ErrInvalid
		}
		expiration = &exp
	}
	want := Sign(q.Get(QueryPath), op, q.Get(QueryUsername), token, expiration)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sigs[0])) != 1 {
		return ErrInvalid
	}
	if expiration != nil && *expiration < now.Unix() {
		return ErrExpired
	}
	return nil
}

// Verify reports whether Check accepts q.
func Verify(q url.Values, op, token string, now time.Time) bool {
	return Check(q, op, token, now) == nil
}
