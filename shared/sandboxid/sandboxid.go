// Package sandboxid makes and reads sandbox IDs.
//
// An ID is 20 characters of [a-z0-9], the shape e2b's SDKs and proxies
// expect (they route on `{port}-{id}.{domain}` hosts). The first 16
// characters are random (crypto/rand, about 82 bits); the last 4 are the tag
// of the node that runs the sandbox, derived from the node's name, so that
// the envd proxy can find a sandbox's host from its ID alone:
//
//	k3x9q2m7v1p8z0c4 t7fa
//	└── random (16) ─┘ └tag┘
//
// A tag is a hint, not a key: 36^4 tags means two nodes can share one, so a
// reader confirms the sandbox in the fresh inventory of the nodes with that
// tag before it routes.
package sandboxid

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

const (
	// Len is the length of an ID.
	Len = 20
	// TagLen is the length of the node tag at the end of an ID.
	TagLen = 4

	alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	// unbiased is the largest multiple of len(alphabet) that fits in a byte:
	// random bytes at or above it are drawn again, so every character is
	// equally likely.
	unbiased = 256 - 256%len(alphabet)
)

// ErrInvalid is wrapped by every error for a malformed ID or tag.
var ErrInvalid = errors.New("invalid sandbox ID")

// Tag identifies a node inside the IDs of its sandboxes.
type Tag string

// NodeTag derives a node's tag from its name: the same name always gives the
// same tag.
func NodeTag(nodeName string) Tag {
	sum := sha256.Sum256([]byte(nodeName))
	var b [TagLen]byte
	for i := range b {
		b[i] = alphabet[int(sum[i])%len(alphabet)]
	}
	return Tag(b[:])
}

// Validate reports whether t is a well-formed tag.
func (t Tag) Validate() error {
	if len(t) != TagLen || !inAlphabet(string(t)) {
		return fmt.Errorf("%w: tag %q is not %d characters of [a-z0-9]", ErrInvalid, string(t), TagLen)
	}
	return nil
}

// New returns a fresh ID for a sandbox on the node with tag t.
func New(t Tag) (string, error) {
	return newFrom(rand.Reader, t)
}

func newFrom(r io.Reader, t Tag) (string, error) {
	if err := t.Validate(); err != nil {
		return "", err
	}
	id := make([]byte, 0, Len)
	buf := make([]byte, 32)
	for len(id) < Len-TagLen {
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", fmt.Errorf("read random bytes: %w", err)
		}
		for _, c := range buf {
			if int(c) < unbiased && len(id) < Len-TagLen {
				id = append(id, alphabet[int(c)%len(alphabet)])
			}
		}
	}
	return string(append(id, t...)), nil
}

// Parse checks an ID and returns the tag of its node.
func Parse(id string) (Tag, error) {
	if len(id) != Len || !inAlphabet(id) {
		return "", fmt.Errorf("%w: %q is not %d characters of [a-z0-9]", ErrInvalid, id, Len)
	}
	return Tag(id[Len-TagLen:]), nil
}

// Valid reports whether id is a well-formed ID.
func Valid(id string) bool {
	_, err := Parse(id)
	return err == nil
}

func inAlphabet(s string) bool {
	for i := range len(s) {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
