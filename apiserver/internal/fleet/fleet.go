// Package fleet is the apiserver's e2bapi.Backend over the fleet of sandbox
// hosts: it places creates with shared/placement (a warm claim first, else a
// cold create on the best of K fresh nodes), finds a sandbox's host from the
// node tag in its ID among the fresh inventories, and calls that host's
// sandboxd for everything else. Lists and templates are answered from the
// inventories, merged with what this replica did in the last publish
// interval or so (read-your-writes). Templates come from a Catalog: the
// fresh nodes' own (single-host mode) or the SandboxTemplate objects
// (Kubernetes mode).
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/metrics"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// Default resources of a sandbox, and how long this replica remembers its
// own writes.
const (
	DefaultCPUMilli  = 2000
	DefaultMemoryMiB = 512
	DefaultRecentTTL = 90 * time.Second
)

// Defaults are the resources a sandbox is created with.
type Defaults struct {
	CPUMilli  int64
	MemoryMiB int64
	DiskMiB   int64
}

// Config configures a Backend.
type Config struct {
	// Source is the freshness-filtered fleet; required.
	Source inventory.Source
	// Placer places creates over Source; required.
	Placer *placement.Placer
	// Clients returns the sandboxd client of a node at an endpoint
	// (host:port), both as the node's inventory names them; the client
	// carries that node's token. Required: sandboxdapi.NewNodeClients
	// builds one.
	Clients func(node, endpoint string) sandboxdv1connect.SandboxdServiceClient
	// Tokens, if set, is each node's token (nodetoken.Tokens.For): with
	// it, a create from a snapshot whose holders are all full or gone has
	// another host pull it, with a ticket made with a holder's token.
	Tokens func(node string) string
	// Defaults are the sandbox resources; zero fields mean
	// DefaultCPUMilli and DefaultMemoryMiB (and the host's disk default).
	// A template's own resources (see Catalog) win over them.
	Defaults Defaults
	// Catalog answers template lists and lookups; nil means
	// NewNodeTemplates(Source), the templates the fresh nodes hold.
	Catalog Catalog
	// ClaimLimit bounds the warm candidates a create tries; ≤ 0 means
	// placement.DefaultClaimLimit.
	ClaimLimit int
	// RecentTTL is how long this replica's own creates, state changes and
	// kills override the inventory in List; ≤ 0 means DefaultRecentTTL.
	RecentTTL time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Metrics counts creates by outcome and warm-claim conflicts; nil
	// counts nothing.
	Metrics *metrics.Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// BodyIdleTimeout cuts a volume content request whose body sends
	// nothing this long (408); ≤ 0 means DefaultBodyIdleTimeout. The
	// server's whole-request read timeout is lifted for those bodies: an
	// upload takes as long as it takes while it moves.
	BodyIdleTimeout time.Duration
	// MaxLifetime, if > 0, is the longest a sandbox runs from its last
	// start (create or resume) when a setTimeout, refresh or connect moves
	// its end: as e2b's API bounds it (by the team's longest), the end is
	// cut to it, and a sandbox that has run that long is refused (400
	// "Max instance length exceeded").
	MaxLifetime time.Duration
}

// DefaultBodyIdleTimeout is Config.BodyIdleTimeout's default.
const DefaultBodyIdleTimeout = 20 * time.Second

// Backend implements e2bapi.Backend over the fleet. It is safe for
// concurrent use.
type Backend struct {
	src        inventory.Source
	catalog    Catalog
	placer     *placement.Placer
	clients    func(node, endpoint string) sandboxdv1connect.SandboxdServiceClient
	tokens     func(node string) string
	defaults   Defaults
	claimLimit int
	ttl        time.Duration
	log        *slog.Logger
	metrics    *metrics.Metrics
	now        func() time.Time
	bodyIdle   time.Duration
	maxLife    time.Duration

	mu     sync.Mutex
	recent map[string]recentWrite // by sandbox ID; guarded by mu
	// claiming holds the warm sandboxes this replica is claiming now;
	// guarded by mu.
	claiming map[string]struct{}
	// unreachable holds the hosts that did not answer, with when that was
	// last logged; guarded by mu.
	unreachable map[string]time.Time
	// seen is where each volume was last found (volumes.go).
	seen volumeSeen
}

var (
	_ e2bapi.Backend       = (*Backend)(nil)
	_ e2bapi.HealthChecker = (*Backend)(nil)
)

// New returns a Backend; it panics if a required field is missing.
func New(cfg Config) *Backend {
	if cfg.Source == nil || cfg.Placer == nil || cfg.Clients == nil {
		panic("fleet.New: Source, Placer and Clients are required")
	}
	b := &Backend{
		src:        cfg.Source,
		catalog:    cfg.Catalog,
		placer:     cfg.Placer,
		clients:    cfg.Clients,
		tokens:     cfg.Tokens,
		defaults:   cfg.Defaults,
		claimLimit: cfg.ClaimLimit,
		ttl:        cfg.RecentTTL,
		log:        cfg.Logger,
		metrics:    cfg.Metrics,
		now:        cfg.Now,
		bodyIdle:   cfg.BodyIdleTimeout,
		maxLife:    cfg.MaxLifetime,
		recent:     make(map[string]recentWrite),
		claiming:   make(map[string]struct{}),

		unreachable: make(map[string]time.Time),
	}
	if b.catalog == nil {
		b.catalog = NewNodeTemplates(cfg.Source)
	}
	if b.bodyIdle <= 0 {
		b.bodyIdle = DefaultBodyIdleTimeout
	}
	if b.defaults.CPUMilli <= 0 {
		b.defaults.CPUMilli = DefaultCPUMilli
	}
	if b.defaults.MemoryMiB <= 0 {
		b.defaults.MemoryMiB = DefaultMemoryMiB
	}
	if b.ttl <= 0 {
		b.ttl = DefaultRecentTTL
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b
}

// Healthy reports whether the fleet can be listed.
func (b *Backend) Healthy(ctx context.Context) error {
	if _, err := b.src.ListNodesShared(ctx); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	return nil
}

// recentWrite is what this replica last did to a sandbox: until the
// inventory shows it (or ttl passes), List answers with it.
type recentWrite struct {
	node string
	team string
	at   time.Time
	// sb is the sandbox as the write left it; nil for a kill.
	sb *e2bapi.Sandbox
}

// remember records a write on a sandbox of team on node; sb nil is a kill.
func (b *Backend) remember(id, team, node string, sb *e2bapi.Sandbox) {
	var c *e2bapi.Sandbox
	if sb != nil {
		cp := *sb
		cp.EnvdAccessToken, cp.TrafficAccessToken = "", "" // never kept: List does not return them
		c = &cp
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recent[id] = recentWrite{node: node, team: team, at: b.now(), sb: c}
}

// microseconds is t as an inventory entry keeps it through JSON
// (v1beta1.MicroTime: truncated to the microsecond), the precision every
// sandbox this backend returns has (toSandbox, fromEntry: a static source,
// make up's, need not have it), so that a sandbox's times do not change
// when the inventory takes over from this replica's write (a listing paged
// meanwhile, whose cursor is the last sandbox's start and ID, would list a
// sandbox twice or skip one), nor differ between a list and a GET. (A host
// whose vk-sandbox predates microseconds publishes whole seconds: until it
// is upgraded, its sandboxes' times lose their fraction when its inventory
// takes over.)
func microseconds(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Truncate(time.Microsecond)
}

// maxSkippedClaims bounds the extra candidates a create asks for to step
// over this replica's claims in flight.
const maxSkippedClaims = 256

// claimCandidates is how many warm candidates a create asks for: the claim
// limit, plus one for each claim this replica has in flight or recently
// wrote (the inventory may still list those as warm), which the create
// skips without an RPC, so concurrent creates do not run out of candidates
// on each other's claims.
func (b *Backend) claimCandidates() int {
	limit := b.claimLimit
	if limit <= 0 {
		limit = placement.DefaultClaimLimit
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return limit + min(len(b.claiming)+len(b.recent), maxSkippedClaims)
}

// startClaim reports whether this replica may claim warm sandbox id: not
// while another of its creates claims it, nor once it has (the inventory
// lists a claimed sandbox as warm until its host publishes again). done
// ends the claim.
func (b *Backend) startClaim(id string) (done func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, busy := b.claiming[id]; busy {
		return nil, false
	}
	if w, ok := b.recent[id]; ok && b.now().Sub(w.at) < b.ttl {
		return nil, false
	}
	b.claiming[id] = struct{}{}
	return func() {
		b.mu.Lock()
		delete(b.claiming, id)
		b.mu.Unlock()
	}, true
}

// recentNode returns the node this replica last wrote id on, if any.
func (b *Backend) recentNode(id string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.recent[id]; ok && b.now().Sub(w.at) < b.ttl {
		return w.node
	}
	return ""
}

// classify maps an error of a sandboxd call on an existing sandbox to the
// e2bapi categories.
func classify(op, id string, err error) error {
	if err == nil {
		return nil
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("%s sandbox %s: %w", op, id, e2bapi.ErrNotFound)
	case connect.CodeFailedPrecondition:
		return fmt.Errorf("%s sandbox %s: %w: %w", op, id, e2bapi.ErrConflict, err)
	case connect.CodeResourceExhausted:
		return fmt.Errorf("%s sandbox %s: %w: %w", op, id, e2bapi.ErrCapacity, err)
	case connect.CodeInvalidArgument:
		return invalidFrom(err)
	}
	return fmt.Errorf("%s sandbox %s: %w", op, id, err)
}

// sandboxdFields maps sandboxd's request fields to the e2b ones.
var sandboxdFields = map[string]string{
	"template": "templateID",
	"timeout":  "timeout",
	"metadata": "metadata",
	"env_vars": "envVars",
}

// invalidFrom turns sandboxd's invalid_argument ("field: reason; …") into an
// *e2bapi.InvalidError for the first field.
func invalidFrom(err error) error {
	msg := err.Error()
	if ce := new(connect.Error); errors.As(err, &ce) {
		msg = ce.Message()
	}
	field, reason := "request", msg
	if i := strings.Index(msg, ": "); i > 0 {
		f := msg[:i]
		reason = msg[i+2:]
		if j := strings.Index(reason, "; "); j >= 0 {
			reason = reason[:j]
		}
		if e, ok := sandboxdFields[f]; ok {
			field = e
		} else {
			field = f
		}
	}
	return e2bapi.Invalid(field, "%s", reason)
}

// wantState reports whether st is among states.
func wantState(states []e2bapi.State, st e2bapi.State) bool {
	return slices.Contains(states, st)
}
