package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/relay"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
)

var (
	_ relay.Resolver    = (*Service)(nil)
	_ relay.AutoResumer = (*Service)(nil)
)

// Resolve implements relay.Resolver: a running or paused sandbox, with its
// traffic token and auto-resume. A warm sandbox belongs to no one yet, so
// it is unknown to the relay (e2b's 502).
func (s *Service) Resolve(_ context.Context, id string) (relay.Sandbox, error) {
	rec, err := s.reg.Get(id)
	if err != nil || (rec.State != registry.StateRunning && rec.State != registry.StatePaused) || rec.Address == "" {
		return relay.Sandbox{}, fmt.Errorf("%w: %s", relay.ErrUnknownSandbox, id)
	}
	return s.toRelay(rec), nil
}

// AutoResume implements relay.AutoResumer: it resumes a paused sandbox that
// has auto-resume, through the same lock and records as the Resume RPC, so
// concurrent requests resume it once (the later ones find it running). Its
// deadline becomes now + its last timeout. The resume runs to its end even
// when the request that woke the sandbox goes away.
func (s *Service) AutoResume(ctx context.Context, id string) (_ relay.Sandbox, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer s.locks.lock(id)()
	rec, err := s.reg.Get(id)
	if err != nil {
		return relay.Sandbox{}, fmt.Errorf("%w: %s", relay.ErrUnknownSandbox, id)
	}
	switch {
	case rec.State == registry.StateRunning:
		return s.toRelay(rec), nil // resumed by someone else meanwhile
	case rec.State != registry.StatePaused || !rec.AutoResume || rec.FilesOnly:
		// The relay answers what it is. A sandbox paused with its files
		// only is booted by an explicit resume alone, as in e2b.
		return s.toRelay(rec), nil
	}
	defer func() { s.metrics.autoResumes.WithLabelValues(resultOf(toConnect(err))).Inc() }()
	lifetime := autoResumeLifetime(rec)
	if lifetime <= 0 {
		return relay.Sandbox{}, fmt.Errorf("auto-resume sandbox %s: %w: it has no timeout to resume with", id, errWrongState)
	}
	began := time.Now()
	if rec, err = s.resumeLocked(ctx, rec, lifetime, false); err != nil {
		if errors.Is(err, registry.ErrNotFound) {
			return relay.Sandbox{}, fmt.Errorf("%w: %s", relay.ErrUnknownSandbox, id)
		}
		return relay.Sandbox{}, err
	}
	s.log.InfoContext(ctx, "sandbox auto-resumed", "sandbox", id, "end_at", rec.EndAt, "duration", time.Since(began))
	return s.toRelay(rec), nil
}

// autoResumeLifetime is how long an auto-resumed sandbox lives: its last
// timeout, or for a record from before timeouts were kept, what it had left
// when paused.
func autoResumeLifetime(rec *store.Record) time.Duration {
	if rec.Timeout > 0 {
		return rec.Timeout
	}
	return rec.EndAt.Sub(rec.PausedAt)
}

// nsPaths is a Network that names a sandbox's namespace (network.Manager):
// the relay reaches a server bound to the sandbox's loopback through it.
type nsPaths interface {
	NSPath(id string) string
}

func (s *Service) toRelay(rec *store.Record) relay.Sandbox {
	var netns string
	if n, ok := s.net.(nsPaths); ok {
		netns = n.NSPath(rec.ID)
	}
	return relay.Sandbox{
		Address:            rec.Address,
		NetNS:              netns,
		TrafficAccessToken: rec.TrafficAccessToken,
		EnvdAccessToken:    rec.EnvdAccessToken,
		Paused:             rec.State != registry.StateRunning,
		// A sandbox paused with its files only is booted by an explicit
		// resume alone, as in e2b: traffic never wakes it.
		AutoResume:      rec.AutoResume && !rec.FilesOnly,
		Boot:            rec.Boots,
		MaskRequestHost: rec.MaskRequestHost,
	}
}
