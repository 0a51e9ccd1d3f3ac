package sandboxid

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// tokenSep joins the sandbox ID and the secret in an access token.
const tokenSep = "."

// NewAccessToken returns a fresh envd access token for sandbox id: the ID,
// a dot, and 32 random bytes in hex. envd compares the whole token; the ID
// in front lets an edge route a request that carries only the token (old
// SDKs' /files calls) to the sandbox's host without having seen it before.
// The ID is no secret; the 256 random bits are.
func NewAccessToken(id string) string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return id + tokenSep + hex.EncodeToString(b[:])
}

// FromAccessToken returns the sandbox ID at the front of a token made by
// NewAccessToken. It checks the shape only: whether the token is the
// sandbox's is for envd to say.
func FromAccessToken(token string) (string, bool) {
	id, secret, ok := strings.Cut(token, tokenSep)
	if !ok || !Valid(id) || len(secret) != 64 {
		return "", false
	}
	for i := range len(secret) {
		if c := secret[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return id, true
}
