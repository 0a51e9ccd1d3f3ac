// Package route decides which sandbox, and which port in it, a request to
// the envd proxy is for (docs/e2b-protocol.md §3.7), in order:
//
//  1. the headers E2b-Sandbox-Id and E2b-Sandbox-Port: if either is present,
//     both must be, once each, well-formed;
//  2. else the host, `<port>-<sandboxID>.<domain>`;
//  3. else, for the JS SDKs 2.7 to 2.13, whose /files calls carry no routing
//     headers, the X-Access-Token value: the sandbox ID at its front
//     (sandboxid.NewAccessToken, what sandboxd issues), or else the tokens
//     this proxy has seen on routed requests (Tokens), for tokens of
//     another shape.
//
// The first two are shared/routing's Parse, the strict parse sandboxd's
// relay uses too; this package adds only the token fallback. It only
// parses: whether the sandbox exists, and where, is the fleet's business.
package route

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/wire"
)

// By names how a request named its sandbox; it is a metric label.
type By string

// The ways a request can name its sandbox.
const (
	ByHeader By = "header"
	ByHost   By = "host"
	ByToken  By = "token"
	// ByNone is the label of a request that named no sandbox (or badly).
	ByNone By = "none"
)

// Target is the sandbox port a request is for, and how it said so.
type Target struct {
	routing.Target
	By By
}

var (
	// ErrBadTarget is wrapped by the error for a request that names a
	// sandbox badly (a 400).
	ErrBadTarget = routing.ErrBadTarget
	// ErrNoTarget is wrapped by the error for a request that names no
	// sandbox in any way this proxy understands (a 400).
	ErrNoTarget = routing.ErrNoTarget
)

// Resolve reads the target of r in the order of the package comment.
// tokens may be nil (no token fallback). Every error wraps ErrBadTarget or
// ErrNoTarget, and its text is fit for the client.
func Resolve(r *http.Request, tokens *Tokens) (Target, error) {
	t, err := routing.Parse(r)
	switch {
	case err == nil:
		by := ByHost
		if r.Header.Get(wire.SandboxIDHeader) != "" {
			by = ByHeader
		}
		return Target{Target: t, By: by}, nil
	case !errors.Is(err, routing.ErrNoTarget):
		return Target{}, err
	}
	token := r.Header.Get(wire.AccessTokenHeader)
	if token == "" {
		return Target{}, ErrNoTarget
	}
	// Tokens from sandboxd carry their sandbox's ID; envd checks the rest.
	if id, ok := sandboxid.FromAccessToken(token); ok {
		return Target{Target: routing.Target{SandboxID: id, Port: routing.EnvdPort}, By: ByToken}, nil
	}
	if tokens == nil {
		return Target{}, ErrNoTarget
	}
	id, ok := tokens.Lookup(token)
	if !ok {
		return Target{}, fmt.Errorf("%w; its %s is not one this proxy has routed by header (old SDKs' /files calls carry only the token; retry after any other call to the sandbox)", ErrNoTarget, wire.AccessTokenHeader)
	}
	return Target{Target: routing.Target{SandboxID: id, Port: routing.EnvdPort}, By: ByToken}, nil
}
