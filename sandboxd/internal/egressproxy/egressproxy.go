// Package egressproxy is sandboxd's per-host egress filter for the
// sandboxes whose rules name domains or deny all (shared/egress, and
// network.SetPolicy for the redirects that lead here):
//
//   - Proxy takes their TCP connections to ports 443 and 80, redirected to
//     it, reads the name they are for (the TLS ClientHello's SNI, the HTTP
//     request's Host; no TLS is intercepted) and decides as e2b does: an
//     allowed name is dialled by name, resolved by the host's resolver (not
//     by whatever address the sandbox found, so /etc/hosts in a sandbox
//     cannot lead an allowed name elsewhere); otherwise the original
//     address is dialled if the rules allow it. What is refused is closed.
//     Either way the address must be one the operator lets sandboxes reach.
//   - DNS takes all their DNS (UDP and TCP, to any server) and answers only
//     for allowed names, by asking the host's resolver; every other name is
//     REFUSED without a query leaving the host, so DNS cannot carry what
//     the rules refuse.
//
// Both know a sandbox by the source address of what it sends.
package egressproxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/fairslots"
	"github.com/skiff-dev/skiff/shared/egress"
)

// Sandboxes tells the filters each sandbox's rules by its address. It is
// safe for concurrent use.
type Sandboxes struct {
	mu sync.RWMutex
	m  map[netip.Addr]*tracked
}

// tracked is one sandbox's team and rules, and a context that ends when
// it is forgotten: what the proxy relays for it ends then.
type tracked struct {
	team   string
	rules  egress.Rules
	ctx    context.Context
	cancel context.CancelFunc
}

// NewSandboxes returns an empty table.
func NewSandboxes() *Sandboxes { return &Sandboxes{m: map[netip.Addr]*tracked{}} }

// Set gives the sandbox at addr, of team, rules. What the proxy relays
// for it goes on under new rules (a connection is decided when it opens).
func (s *Sandboxes) Set(addr netip.Addr, team string, r egress.Rules) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.m[addr]; t != nil {
		t.team, t.rules = team, r
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.m[addr] = &tracked{team: team, rules: r, ctx: ctx, cancel: cancel}
}

// Update gives the sandbox at addr rules if it is tracked (its rules
// restricted something), and does nothing if not: a sandbox whose rules
// stop restricting anything keeps what the proxy relays for it until it
// ends.
func (s *Sandboxes) Update(addr netip.Addr, r egress.Rules) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.m[addr]; t != nil {
		t.rules = r
	}
}

// Len is how many sandboxes it tracks.
func (s *Sandboxes) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}

// Delete forgets the sandbox at addr, which ended (killed, stopped for a
// files-only pause, or a create undone), and ends what the proxy relays
// for it: a connection whose other end never closes would otherwise hold
// its slot, counted against the next sandbox at that address, until
// sandboxd restarts.
func (s *Sandboxes) Delete(addr netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.m[addr]; t != nil {
		t.cancel()
		delete(s.m, addr)
	}
}

// Team returns the team of the sandbox at addr; "" for an address no
// sandbox with rules has (what is served for it is refused at once).
func (s *Sandboxes) Team(addr netip.Addr) string {
	if s == nil {
		return ""
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if t := s.m[addr.Unmap()]; t != nil {
		return t.team
	}
	return ""
}

// Get returns the rules of the sandbox at addr.
func (s *Sandboxes) Get(addr netip.Addr) (egress.Rules, bool) {
	r, _, ok := s.lookup(addr)
	return r, ok
}

// lookup returns the rules of the sandbox at addr and the context that
// ends when it is forgotten.
func (s *Sandboxes) lookup(addr netip.Addr) (egress.Rules, context.Context, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t := s.m[addr.Unmap()]
	if t == nil {
		return egress.Rules{}, nil, false
	}
	return t.rules, t.ctx, true
}

// Options configure the filters.
type Options struct {
	Sandboxes *Sandboxes
	// Permitted says whether the operator lets sandboxes reach an address
	// (network.Manager.Permitted).
	Permitted func(netip.Addr) bool
	// Resolvers are the host's DNS servers (network.Manager.Resolvers),
	// asked for allowed names.
	Resolvers func() []netip.Addr
	// ResolverPort is the resolvers' port; 53 by default.
	ResolverPort uint16
	// DialTimeout bounds a dial out; 10 s by default.
	DialTimeout time.Duration
	// PeekTimeout bounds the wait for a connection's first bytes (the
	// ClientHello or request head); 10 s by default.
	PeekTimeout time.Duration
	// TeamShare bounds what one team's sandboxes hold together to 1/N of
	// each server's slots; DefaultTeamShare by default, 1: no bound by
	// team. Sandboxes without a team count as one team.
	TeamShare int
	Logger    *slog.Logger
}

func (o *Options) defaults() {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.PeekTimeout <= 0 {
		o.PeekTimeout = 10 * time.Second
	}
	if o.ResolverPort == 0 {
		o.ResolverPort = 53
	}
	if o.TeamShare <= 0 {
		o.TeamShare = DefaultTeamShare
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// resolver asks the host's resolvers (not the host's /etc/resolv.conf,
// which a test or a systemd host may point at a stub on loopback).
func resolver(o *Options) *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			rs := o.Resolvers()
			if len(rs) == 0 {
				return nil, errors.New("no resolver")
			}
			var d net.Dialer
			var err error
			for _, r := range rs {
				var c net.Conn
				if c, err = d.DialContext(ctx, network, netip.AddrPortFrom(r, o.ResolverPort).String()); err == nil {
					return c, nil
				}
			}
			return nil, err
		},
	}
}

// perSandbox is the share of a server's slots (connections, queries in
// flight) that one sandbox may hold, and DefaultTeamShare the share that
// one team's sandboxes may hold together (Options.TeamShare): a sandbox's
// tenant decides how long its connections stay, and one that held them all
// would cut every other sandbox of the host off its filtered egress. A
// tenant with many sandboxes on the host holds at most a quarter, so it
// takes four tenants at their bounds to fill a server.
const (
	perSandbox       = 16
	DefaultTeamShare = 4
)

// shares are a server's slots, shared by sandbox and by team.
type shares struct {
	most, perTeam int
	sandboxes     *fairslots.Slots[netip.Addr]
	teams         *fairslots.Slots[string]
	teamOf        func(netip.Addr) string
}

// newShares returns most slots, a perSandbox-th of them to one sandbox
// and a teamShare-th to one team (teamOf tells a sandbox's); a teamShare
// of 1 bounds no team.
func newShares(most, teamShare int, teamOf func(netip.Addr) string) *shares {
	s := &shares{most: most, perTeam: most, teamOf: teamOf, sandboxes: fairslots.New[netip.Addr](most, most/perSandbox)}
	if teamShare > 1 {
		s.perTeam = most / teamShare
		s.teams = fairslots.New[string](most, s.perTeam)
	}
	return s
}

// refusal says why take refused a slot (0: it did not).
type refusal int

const (
	taken refusal = iota
	sandboxFull
	teamFull
	allFull
)

// take takes a slot for the sandbox at src, and says which team's it is
// (for put), or why it cannot.
func (s *shares) take(src netip.Addr) (string, refusal) {
	team := s.teamOf(src)
	if s.teams != nil {
		switch s.teams.Take(team) {
		case fairslots.KeyFull:
			return team, teamFull
		case fairslots.AllFull:
			return team, allFull
		}
	}
	if r := s.sandboxes.Take(src); r != fairslots.Taken {
		if s.teams != nil {
			s.teams.Put(team)
		}
		if r == fairslots.KeyFull {
			return team, sandboxFull
		}
		return team, allFull
	}
	return team, taken
}

// put gives back what take gave.
func (s *shares) put(src netip.Addr, team string) {
	s.sandboxes.Put(src)
	if s.teams != nil {
		s.teams.Put(team)
	}
}

// serveConns has handle serve each connection ln takes, at most
// slots.most at once, a sixteenth of them from one sandbox and a quarter
// from one team's (one more is closed at once), until ctx ends; then it
// closes ln and the connections and waits for handle to return. Errors accepting are retried after a pause
// (running out of file descriptors passes).
func serveConns(ctx context.Context, ln net.Listener, slots *shares, log *slog.Logger, what string, handle func(net.Conn)) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var full refusals
	var pause time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			log.Warn("accept failed; retrying", "server", what, "error", err, "in", pause)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		src, _ := addrOf(c.RemoteAddr())
		team, r := slots.take(src)
		if r != taken {
			full.log(log, r, what, src, team, slots)
			_ = c.Close()
			continue
		}
		wg.Go(func() {
			defer slots.put(src, team)
			defer c.Close()
			closeOnEnd := context.AfterFunc(ctx, func() { _ = c.Close() })
			defer closeOnEnd()
			handle(c)
		})
	}
}

// refusals logs the connections or queries a server refused for want of a
// slot, at most once a second: a sandbox that keeps past its share would
// otherwise write a line for each.
type refusals struct {
	last   time.Time
	missed int
}

func (r *refusals) log(log *slog.Logger, why refusal, what string, src netip.Addr, team string, slots *shares) {
	r.missed++
	if time.Since(r.last) < time.Second {
		return
	}
	log.Warn("too many connections or queries; refusing those past the bound", "server", what, "from", src, "team", team,
		"past", map[refusal]string{sandboxFull: "the sandbox's share", teamFull: "its team's share (sandboxd --egress-team-share)", allFull: "every sandbox's bound"}[why],
		"max", slots.most, "max_per_sandbox", slots.most/perSandbox, "max_per_team", slots.perTeam, "refused_since_last_line", r.missed)
	r.last, r.missed = time.Now(), 0
}
