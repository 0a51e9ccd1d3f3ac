package route

import (
	"container/list"
	"crypto/sha256"
	"sync"
)

// Tokens remembers which sandbox an envd access token belongs to, for the
// SDKs whose /files calls carry the token but no routing header. It learns
// from requests that named their sandbox (Learn, after envd accepted the
// token) and forgets the least recently used token beyond its bound.
//
// It keeps a SHA-256 digest of each token, never the token itself, so its
// memory does not grow with what clients send and holds no credential.
// The zero value is not usable; it is safe for concurrent use.
type Tokens struct {
	max int

	mu    sync.Mutex
	order *list.List // of *tokenEntry, most recently used first
	byKey map[tokenKey]*list.Element
}

type tokenKey [sha256.Size]byte

type tokenEntry struct {
	key       tokenKey
	sandboxID string
}

// NewTokens returns a map of at most max tokens; max <= 0 gives nil, which
// knows no token (token routing off).
func NewTokens(max int) *Tokens {
	if max <= 0 {
		return nil
	}
	return &Tokens{max: max, order: list.New(), byKey: make(map[tokenKey]*list.Element)}
}

// Learn records that token belongs to sandboxID. A token already known
// moves to the front, taking the new sandbox if it differs.
func (t *Tokens) Learn(token, sandboxID string) {
	if t == nil || token == "" {
		return
	}
	k := tokenKey(sha256.Sum256([]byte(token)))
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byKey[k]; ok {
		el.Value.(*tokenEntry).sandboxID = sandboxID
		t.order.MoveToFront(el)
		return
	}
	t.byKey[k] = t.order.PushFront(&tokenEntry{key: k, sandboxID: sandboxID})
	for t.order.Len() > t.max {
		oldest := t.order.Back()
		t.order.Remove(oldest)
		delete(t.byKey, oldest.Value.(*tokenEntry).key)
	}
}

// Lookup returns the sandbox of token, and marks it used.
func (t *Tokens) Lookup(token string) (string, bool) {
	if t == nil || token == "" {
		return "", false
	}
	k := tokenKey(sha256.Sum256([]byte(token)))
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.byKey[k]
	if !ok {
		return "", false
	}
	t.order.MoveToFront(el)
	return el.Value.(*tokenEntry).sandboxID, true
}

// Forget drops token if it still belongs to sandboxID (the sandbox is gone).
func (t *Tokens) Forget(token, sandboxID string) {
	if t == nil || token == "" {
		return
	}
	k := tokenKey(sha256.Sum256([]byte(token)))
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byKey[k]; ok && el.Value.(*tokenEntry).sandboxID == sandboxID {
		t.order.Remove(el)
		delete(t.byKey, k)
	}
}

// Len returns how many tokens are known.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order.Len()
}
