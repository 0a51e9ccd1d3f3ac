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

// Verify reports whether q carries exactly one signature valid for op on
// q's path and username under token, and unexpired at now. Anything not
// exactly valid (repeated or non-canonical parameters) is rejected, and so
// is every signature when token is empty.
func Verify(q url.Values, op, token string, now time.Time) bool {
	sigs := q[QuerySignature]
	if len(sigs) != 1 || token == "" {
		return false
	}
	var expiration *int64
	if exps, ok := q[QueryExpiration]; ok {
		if len(exps) != 1 {
			return false
		}
		exp, err := strconv.ParseInt(exps[0], 10, 64)
		if err != nil || strconv.FormatInt(exp, 10) != exps[0] || exp < now.Unix() {
			return false
		}
		expiration = &exp
	}
	want := Sign(q.Get(QueryPath), op, q.Get(QueryUsername), token, expiration)
	return subtle.ConstantTimeCompare([]byte(want), []byte(sigs[0])) == 1
}
