package service

import (
	"crypto/rand"
	"encoding/hex"
)

// newToken returns a fresh secret: 32 random bytes, hex. (envd access
// tokens carry the sandbox ID in front: sandboxid.NewAccessToken.)
func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
