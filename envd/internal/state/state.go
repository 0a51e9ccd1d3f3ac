// Package state holds what the host sets on envd through POST /init: the
// access token, the default user and workdir, and the default environment.
// Every service reads it through one *Sandbox.
package state

import (
	"crypto/subtle"
	"maps"
	"net/http"
	"sync"

	"github.com/skiff-dev/skiff/envd/internal/identity"
	"github.com/skiff-dev/skiff/wire"
)

// DefaultUser is the user a request without one runs as, until /init sets
// another.
const DefaultUser = "root"

// Sandbox is envd's per-sandbox configuration. It is safe for concurrent use.
type Sandbox struct {
	mu      sync.RWMutex
	token   []byte // nil: no token set, nothing is checked
	user    string
	workdir string
	envs    map[string]string
}

// New returns the configuration of a sandbox that /init has not reached yet.
func New() *Sandbox {
	return &Sandbox{user: DefaultUser, envs: map[string]string{"E2B_SANDBOX": "true"}}
}

// Apply sets what in, the body of POST /init, carries; fields it leaves out keep their values. An
// access token of "" clears the token.
func (s *Sandbox) Apply(in wire.EnvdInit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.AccessToken != nil {
		s.token = nil
		if *in.AccessToken != "" {
			s.token = []byte(*in.AccessToken)
		}
	}
	maps.Copy(s.envs, in.EnvVars)
	if in.DefaultUser != "" {
		s.user = in.DefaultUser
	}
	if in.DefaultWorkdir != "" {
		s.workdir = in.DefaultWorkdir
	}
}

// TokenSet reports whether requests must carry the access token.
func (s *Sandbox) TokenSet() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.token != nil
}

// CheckToken reports whether presented is the access token, in constant time;
// with no token set, every request passes.
func (s *Sandbox) CheckToken(presented string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.token == nil {
		return true
	}
	return subtle.ConstantTimeCompare(s.token, []byte(presented)) == 1
}

// Token returns the access token ("" when none is set), for URL signatures.
func (s *Sandbox) Token() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return string(s.token)
}

// User resolves name, or the default user when name is "".
func (s *Sandbox) User(name string) (*identity.User, error) {
	if name == "" {
		s.mu.RLock()
		name = s.user
		s.mu.RUnlock()
	}
	return identity.Lookup(name)
}

// RequestUser resolves the user a request acts as: the username of its
// `Authorization: Basic` header, else the default user. Its errors wrap
// identity.ErrUnknownUser.
func (s *Sandbox) RequestUser(h http.Header) (*identity.User, error) {
	return s.User(identity.BasicUsername(h))
}

// Workdir returns the default working directory ("" means the user's home).
func (s *Sandbox) Workdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.workdir
}

// Env returns a copy of the default environment of every process.
func (s *Sandbox) Env() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.envs)
}
