package server

import (
	"context"
	"fmt"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/relay"
)

var _ relay.Resolver = (*Server)(nil)

// Resolve implements relay.Resolver: the address of a running sandbox. A
// warm sandbox belongs to no one yet and a paused one cannot answer, so
// both are unknown to the relay (e2b's 502).
func (s *Server) Resolve(_ context.Context, id string) (string, error) {
	rec, err := s.reg.Get(id)
	if err != nil || rec.State != registry.StateRunning || rec.Address == "" {
		return "", fmt.Errorf("%w: %s", relay.ErrUnknownSandbox, id)
	}
	return rec.Address, nil
}
