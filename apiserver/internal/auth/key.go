package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
)

const (
	// KeyPrefix starts every API key.
	KeyPrefix = "e2b_"
	// keyHexLen is the number of hex characters after KeyPrefix: 20 random
	// bytes, as e2b issues them.
	keyHexLen = 40
	keyLen    = len(KeyPrefix) + keyHexLen
)

// ErrUnknownKey is what a Store answers for a missing, malformed, unknown or
// revoked key. It deliberately does not say which.
var ErrUnknownKey = errors.New("unknown API key")

// Store maps an API key to its team (a namespace name).
type Store interface {
	// Team returns the team key belongs to, ErrUnknownKey if it belongs to
	// none, or another error if the store cannot answer right now.
	Team(ctx context.Context, key string) (team string, err error)
}

// NewKey returns a fresh API key: "e2b_" and 40 lowercase hex characters
// from crypto/rand.
func NewKey() (string, error) {
	var b [keyHexLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate API key: %w", err)
	}
	return KeyPrefix + hex.EncodeToString(b[:]), nil
}

// ValidKey reports whether s has the shape of a key NewKey makes. It says
// nothing about whether any team owns s.
func ValidKey(s string) bool {
	if len(s) != keyLen || s[:len(KeyPrefix)] != KeyPrefix {
		return false
	}
	for i := len(KeyPrefix); i < len(s); i++ {
		if !isLowerHex(s[i]) {
			return false
		}
	}
	return true
}

// Hash returns the lowercase hex SHA-256 digest of key, the only form in
// which keys are stored (in Secrets and in memory).
//
// A plain, unsalted hash is enough here: a key carries 160 random bits, so
// neither a dictionary nor a precomputed table can reverse its digest, and
// equal digests must be findable by an index, which a per-key salt would
// prevent.
func Hash(key string) string {
	d := digest(key)
	return hex.EncodeToString(d[:])
}

func digest(key string) [sha256.Size]byte {
	return sha256.Sum256([]byte(key))
}

// equalDigests compares two digests in constant time.
func equalDigests(a, b []byte) bool {
	return subtle.ConstantTimeCompare(a, b) == 1
}

// parseHexDigest decodes a hex SHA-256 digest as stored in a Secret; it
// accepts either case and reports false for anything else.
func parseHexDigest(s string) ([sha256.Size]byte, bool) {
	var d [sha256.Size]byte
	if len(s) != hex.EncodedLen(sha256.Size) {
		return d, false
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, false
	}
	return d, true
}

func isLowerHex(c byte) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f')
}
