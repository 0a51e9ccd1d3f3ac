// Package nodetoken says which token each sandbox host's sandboxd accepts
// (its --auth-token-file), for the control plane's calls and relayed
// requests: one fleet-wide token, or a token per host derived from a fleet
// key.
//
// With a fleet key, the token of the host whose node is named node is
//
//	token(node) = hex(HMAC-SHA256(key, node))
//
// The readers (sandbox-apiserver, sandbox-envd-proxy) hold the key and send
// each host the token of the node whose NodeInventory they route to; each
// host holds only its own token. A host that is compromised, or that names
// another host's address as its endpoint, so learns only its own token,
// which no other host's sandboxd accepts. With the fleet-wide token, every
// host holds the token that every other host accepts.
package nodetoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/shared/daemon"
)

const (
	// MinTokenLen is the shortest token sandboxd accepts in its
	// --auth-token-file.
	MinTokenLen = 16
	// MinKeyLen is the shortest fleet key: 32 bytes, as many as the
	// HMAC's output (`openssl rand -hex 32` makes a key of 64).
	MinKeyLen = 32
)

// Derive returns the token of node under the fleet key: hex(HMAC-SHA256(key,
// node)), 64 characters.
func Derive(key []byte, node string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(node)) // a hash's Write never fails
	return hex.EncodeToString(m.Sum(nil))
}

// Tokens says which token each sandboxd accepts. It is safe for concurrent
// use.
type Tokens struct {
	shared  string
	key     []byte
	derived sync.Map // node name → its token; nodes come from the fleet's inventories
}

// Shared is one token that every sandboxd accepts.
func Shared(token string) *Tokens { return &Tokens{shared: token} }

// Derived derives each node's token from the fleet key.
func Derived(key []byte) *Tokens { return &Tokens{key: key} }

// PerNode reports whether each node has a token of its own.
func (t *Tokens) PerNode() bool { return t.key != nil }

// For returns the token node's sandboxd accepts: the fleet-wide one, for
// any node (also an unnamed one), or the one derived for node, with none
// ("") for an unnamed node.
func (t *Tokens) For(node string) string {
	if t.key == nil {
		return t.shared
	}
	if node == "" {
		return ""
	}
	if tok, ok := t.derived.Load(node); ok {
		return tok.(string)
	}
	tok := Derive(t.key, node)
	t.derived.Store(node, tok)
	return tok
}

// ReadTokenFile reads the node token file named by flag: the token is its
// content without surrounding white space, at least MinTokenLen characters,
// as sandboxd requires.
func ReadTokenFile(flag, path string) (string, error) {
	return daemon.ReadSecretFile(flag, path, MinTokenLen)
}

// ReadKeyFile reads the fleet key file named by flag: the key is its
// content without surrounding white space (as bytes, not decoded), at
// least MinKeyLen (openssl rand -hex 32 makes one).
func ReadKeyFile(flag, path string) ([]byte, error) {
	key, err := daemon.ReadSecretFile(flag, path, MinKeyLen)
	if err != nil {
		return nil, err
	}
	return []byte(key), nil
}

// Options are where a reader of the fleet finds its node tokens:
// --sandboxd-token-file (one for every host) or --node-token-key-file (a
// key to derive each host's from).
type Options struct {
	// TokenFile holds the token every sandboxd accepts.
	TokenFile string
	// KeyFile holds the fleet key.
	KeyFile string
}

// AddFlags registers --sandboxd-token-file and --node-token-key-file,
// defaulting to the current values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.TokenFile, "sandboxd-token-file", o.TokenFile,
		"File holding the one token every sandboxd host accepts (their --auth-token-file): its content without surrounding white space, at least 16 characters. "+
			"Required with --inventory static; with --inventory kube, this or --node-token-key-file.")
	fs.StringVar(&o.KeyFile, "node-token-key-file", o.KeyFile,
		"With --inventory kube only (refused with static): file holding the fleet key, its content without surrounding white space (not decoded), "+
			"at least 32 bytes (openssl rand -hex 32 makes one). The host whose node is N gets the token hex(HMAC-SHA256(key, N)) "+
			"(sandbox-apiserver node-token prints it), so that each sandboxd accepts its own token only. Excludes --sandboxd-token-file.")
}

// Validate reports options that cannot work, naming the flags. perNode says
// whether the binary knows each host's name before it calls it (--inventory
// kube): without that, only a fleet-wide token can work.
func (o Options) Validate(perNode bool) error {
	switch {
	case o.TokenFile != "" && o.KeyFile != "":
		return errors.New("--sandboxd-token-file and --node-token-key-file exclude each other: a fleet-wide token, or a token per host derived from the key")
	case o.KeyFile != "" && !perNode:
		return errors.New("--node-token-key-file is only read with --inventory kube (static mode calls its hosts before it knows their names): use --sandboxd-token-file")
	case o.TokenFile == "" && o.KeyFile == "" && !perNode:
		return errors.New("--sandboxd-token-file is required")
	case o.TokenFile == "" && o.KeyFile == "":
		return errors.New("set --sandboxd-token-file (a token every host accepts) or --node-token-key-file (a token per host, derived from the fleet key)")
	}
	return nil
}

// Load reads the token file or the key file. o must be valid.
func (o Options) Load() (*Tokens, error) {
	if o.KeyFile != "" {
		key, err := ReadKeyFile("--node-token-key-file", o.KeyFile)
		if err != nil {
			return nil, err
		}
		return Derived(key), nil
	}
	tok, err := ReadTokenFile("--sandboxd-token-file", o.TokenFile)
	if err != nil {
		return nil, err
	}
	return Shared(tok), nil
}
