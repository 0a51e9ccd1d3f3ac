package placement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// Request is what a sandbox needs of its host. The caller resolves the
// template's defaults first: a zero here asks for nothing of that resource.
type Request struct {
	// Template is the SandboxTemplate's name; only nodes listing it qualify.
	Template string
	// Version, if set, is the template's version: only nodes listing the
	// template at that version qualify (a snapshot's layers stand on one).
	Version string
	// Exclude, if set, rules nodes out by name.
	Exclude func(node string) bool
	// CPUMilli is CPU in thousandths of a core.
	CPUMilli int64
	// MemoryMiB is memory in mebibytes.
	MemoryMiB int64
	// Spread, if set, says how many sandboxes of the same kind (a warm
	// pool's) a node already holds: of the sampled nodes, one with the
	// fewest wins, and the score only breaks ties, so that a pool spreads
	// across the fleet rather than packing the emptiest node.
	Spread func(node string) int
}

// Created is what a successful create tells Place about the sandbox it
// started, so that the Placer goes on counting it against its node until the
// node's inventory does: a burst of creates between two publishes then
// spreads as if each saw the ones before it.
type Created struct {
	// ID is the sandbox's. The count ends at the first inventory of the
	// node that lists it (whose allocation counts it), or at Forget. A zero
	// Created (no ID and no StartedAt) is not counted past the create.
	ID string
	// StartedAt is when the host started the sandbox, by the host's clock.
	// A sandbox that ends before any inventory lists it stops counting at
	// the first inventory of the node stamped a second or more after it
	// (the host's publisher reads its sandboxes after it takes the stamp,
	// and stamps keep whole seconds). Zero: only a listing, Forget and
	// Options.MaxHold end the count.
	StartedAt time.Time
}

// Placer places sandboxes on the fleet a Source serves. It is safe for
// concurrent use, and one Placer should serve every create of a process,
// since it counts the creates it has in flight and the sandboxes it placed
// that the inventory does not count yet.
type Placer struct {
	src            inventory.Source
	k, attempts    int
	retryable      func(error) bool
	claimRetryable func(error) bool
	maxHold        time.Duration
	now            func() time.Time

	mu       sync.Mutex
	rnd      *rand.Rand       // guarded by mu; nil means the global source
	inflight map[string]usage // by node name, creates under way; guarded by mu
	held     map[string]*held // by node name, placed but not yet in the inventory; guarded by mu
}

// usage is what the creates in flight on one node hold.
type usage struct{ cpuMilli, memoryMiB, sandboxes int64 }

// add returns u with req's resources added sign times (1 or -1).
func (u usage) add(req Request, sign int64) usage {
	return usage{u.cpuMilli + sign*req.CPUMilli, u.memoryMiB + sign*req.MemoryMiB, u.sandboxes + sign}
}

// held is what one node holds of the sandboxes this Placer placed there
// that the node's inventory does not count yet.
type held struct {
	placed []placed
	// checked is the node's inventory as placed was last pruned by it;
	// zero (a new hold): none.
	checked inventoryKey
}

// inventoryKey tells one read of a node's inventory from the next: its
// resourceVersion, with its stamp and size in case a joined version (see
// kubeinventory) repeats.
type inventoryKey struct {
	rv        string
	stamp     time.Time
	sandboxes int
}

// keyOf is n's inventoryKey.
func keyOf(n *v1beta1.NodeInventory) inventoryKey {
	k := inventoryKey{rv: n.ResourceVersion, sandboxes: len(n.Spec.Sandboxes)}
	if n.PublishedAt != nil {
		k.stamp = n.PublishedAt.Time
	}
	return k
}

// placed is one sandbox counted against its node: until the node's
// inventory lists it, the node's stamp reaches until, or this Placer's clock
// reaches expires.
type placed struct {
	id      string
	req     Request
	until   time.Time // host clock; zero: no stamp ends it
	expires time.Time // this Placer's clock
}

// New returns a Placer over src. Zero fields of opts take their defaults.
func New(src inventory.Source, opts Options) *Placer {
	p := &Placer{
		src:            src,
		k:              opts.SampleSize,
		attempts:       opts.MaxAttempts,
		retryable:      opts.Retryable,
		claimRetryable: opts.ClaimRetryable,
		maxHold:        opts.MaxHold,
		now:            opts.Now,
		rnd:            opts.Rand,
		inflight:       make(map[string]usage),
		held:           make(map[string]*held),
	}
	if p.maxHold <= 0 {
		p.maxHold = DefaultMaxHold
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.k <= 0 {
		p.k = DefaultSampleSize
	}
	if p.attempts <= 0 {
		p.attempts = DefaultMaxAttempts
	}
	if p.retryable == nil {
		p.retryable = IsRetryable
	}
	if p.claimRetryable == nil {
		p.claimRetryable = IsClaimRetryable
	}
	return p
}

// Place runs create on the best of K sampled nodes that have the template and
// room for req, and returns the node's name once a create succeeds (see the
// package documentation for the algorithm).
//
// create gets the node's inventory (its Endpoint is where to dial), must not
// modify it, reports the sandbox it started (see Created), and should wrap a
// full node's refusal into ErrNodeFull and an unreachable node into
// ErrNodeUnavailable: those exclude the node and try
// another, up to Options.MaxAttempts nodes. Any other error, or one that
// arrives once ctx is done, is returned at once, wrapped with the node's name.
// With no eligible node left, Place returns an error wrapping ErrNoCapacity
// (and the last refusal, if any).
func (p *Placer) Place(ctx context.Context, req Request, create func(context.Context, *v1beta1.NodeInventory) (Created, error)) (string, error) {
	if req.CPUMilli < 0 || req.MemoryMiB < 0 {
		return "", fmt.Errorf("place sandbox: negative request (cpu %dm, memory %dMi)", req.CPUMilli, req.MemoryMiB)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("place sandbox: %w", err)
	}
	nodes, err := p.src.ListNodesShared(ctx)
	if err != nil {
		return "", fmt.Errorf("place sandbox: list nodes: %w", err)
	}
	var buf [8]string
	excluded := buf[:0] // nodes that refused; at most p.attempts
	var last error
	for range p.attempts {
		i := p.reserve(nodes, req, excluded)
		if i < 0 {
			break
		}
		node := &nodes[i]
		err := p.create(ctx, node, req, create)
		if err == nil {
			return node.Name, nil
		}
		wrapped := fmt.Errorf("create on node %s: %w", node.Name, err)
		if ctx.Err() != nil || !p.retryable(err) {
			return "", wrapped
		}
		excluded = append(excluded, node.Name)
		last = wrapped
	}
	full := diskPressured(nodes, req)
	if last == nil {
		return "", fmt.Errorf("%w: template %q, cpu %dm, memory %dMi%s", ErrNoCapacity, req.Template, req.CPUMilli, req.MemoryMiB, full)
	}
	return "", fmt.Errorf("%w: %d nodes refused%s, last: %w", ErrNoCapacity, len(excluded), full, last)
}

// diskPressured names, for an operator's log, the nodes with req's
// template (and not excluded by it) that placement left out for their
// disk pressure (the first few), or is empty.
func diskPressured(nodes []v1beta1.NodeInventory, req Request) string {
	var names []string
	n := 0
	for i := range nodes {
		if nodes[i].Spec.DiskPressure && req.wants(&nodes[i]) {
			if n++; n <= 3 {
				names = append(names, nodes[i].Name)
			}
		}
	}
	if n == 0 {
		return ""
	}
	if n > len(names) {
		names = append(names, fmt.Sprintf("and %d more", n-len(names)))
	}
	return fmt.Sprintf(" (left out, their disk below its reserve: %s)", strings.Join(names, ", "))
}

// create runs create on node with req reserved there. The reservation ends
// however create ends; a sandbox it reports is held against the node in its
// stead (see Created).
func (p *Placer) create(ctx context.Context, node *v1beta1.NodeInventory, req Request, create func(context.Context, *v1beta1.NodeInventory) (Created, error)) (err error) {
	var c Created
	defer func() { // also when create panics
		p.mu.Lock()
		defer p.mu.Unlock()
		p.releaseLocked(node.Name, req)
		if err == nil {
			p.holdLocked(node.Name, req, c)
		}
	}()
	c, err = create(ctx, node)
	return err
}

// holdLocked counts sandbox c, placed on node for req, against the node;
// a zero Created is not counted.
func (p *Placer) holdLocked(node string, req Request, c Created) {
	if c.ID == "" && c.StartedAt.IsZero() {
		return
	}
	h := p.held[node]
	if h == nil {
		h = &held{}
		p.held[node] = h
	}
	pl := placed{id: c.ID, req: req, expires: p.now().Add(p.maxHold)}
	if !c.StartedAt.IsZero() {
		pl.until = c.StartedAt.Add(time.Second)
	}
	h.placed = append(h.placed, pl)
	h.checked = inventoryKey{} // the inventory already seen may list it
}

// Hold counts sandbox c against node as if this Placer had placed it there
// for req, until the node's inventory counts it (see Created): for the
// sandboxes a host starts on a node the caller chose rather than through
// Place (a fork, on its source's host; a create from a snapshot, on a host
// that holds it). A zero Created is not counted.
func (p *Placer) Hold(node string, req Request, c Created) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdLocked(node, req, c)
}

// Forget stops counting sandbox id, which this Placer placed or was told
// of by Hold, against its node: the caller killed it.
func (p *Placer) Forget(id string) {
	if id == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, h := range p.held {
		if i := slices.IndexFunc(h.placed, func(pl placed) bool { return pl.id == id }); i >= 0 {
			h.placed = slices.Delete(h.placed, i, i+1)
			if len(h.placed) == 0 {
				delete(p.held, name)
			}
			return
		}
	}
}

// pruneLocked ends the holds that nodes' inventories now count (they list
// the sandbox, or are stamped past its until) or that have expired. An
// inventory is read again only when it changed since it was last read (see
// inventoryKey). Nodes not listed keep their holds until they expire. A
// sharded inventory may list a sandbox (its shard) a moment before its
// allocation (the NodeInventory, written after the shards) counts it: the
// node is then undercounted for that moment, as without holds, and sandboxd
// refuses what does not fit.
func (p *Placer) pruneLocked(nodes []v1beta1.NodeInventory) {
	if len(p.held) == 0 {
		return
	}
	now := p.now()
	for i := range nodes {
		n := &nodes[i]
		h := p.held[n.Name]
		if h == nil {
			continue
		}
		k := keyOf(n)
		if k.rv != "" && h.checked == k {
			continue
		}
		h.checked = k
		listed := h.listedIn(n)
		h.placed = slices.DeleteFunc(h.placed, func(pl placed) bool {
			return listed[pl.id] ||
				!pl.until.IsZero() && n.PublishedAt != nil && !n.PublishedAt.Time.Before(pl.until)
		})
	}
	for name, h := range p.held {
		h.placed = slices.DeleteFunc(h.placed, func(pl placed) bool { return !now.Before(pl.expires) })
		if len(h.placed) == 0 {
			delete(p.held, name)
		}
	}
}

// listedIn returns which of h's sandboxes n's inventory lists.
func (h *held) listedIn(n *v1beta1.NodeInventory) map[string]bool {
	ids := make(map[string]bool, len(h.placed))
	for _, pl := range h.placed {
		if pl.id != "" {
			ids[pl.id] = true
		}
	}
	listed := make(map[string]bool)
	for i := 0; i < len(n.Spec.Sandboxes) && len(listed) < len(ids); i++ {
		if id := n.Spec.Sandboxes[i].ID; ids[id] {
			listed[id] = true
		}
	}
	return listed
}

// maxStackSample is the largest K whose sample lives on the stack.
const maxStackSample = 16

// candidate is a sampled node: its index in the listing and its score.
type candidate struct {
	at     int
	score  float64
	spread int
}

// better reports whether c beats best: fewer of its kind, then a higher
// score; 0 is a tie.
func (c candidate) better(best candidate) int {
	if c.spread != best.spread {
		if c.spread < best.spread {
			return 1
		}
		return -1
	}
	switch {
	case c.score > best.score:
		return 1
	case c.score < best.score:
		return -1
	}
	return 0
}

// reserve samples K eligible nodes that are not excluded, reserves req on the
// best of them and returns its index, or -1 when no node is eligible.
//
// It holds p.mu throughout, so that two placements cannot both take the last
// room on a node; the pass is a few microseconds for hundreds of nodes.
func (p *Placer) reserve(nodes []v1beta1.NodeInventory, req Request, excluded []string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(nodes)

	var buf [maxStackSample]candidate
	sample := buf[:0]
	if p.k > len(buf) {
		sample = make([]candidate, 0, p.k)
	}
	// Reservoir sampling: after the n-th eligible node, sample is a uniform
	// random subset of min(n, K) of the first n.
	eligible := 0
	for i := range nodes {
		n := &nodes[i]
		if !req.wants(n) || slices.Contains(excluded, n.Name) {
			continue
		}
		s, ok := p.scoreLocked(n, req)
		if !ok {
			continue
		}
		eligible++
		c := candidate{at: i, score: s}
		if req.Spread != nil {
			c.spread = req.Spread(n.Name)
		}
		if len(sample) < p.k {
			sample = append(sample, c)
		} else if j := p.intNLocked(eligible); j < p.k {
			sample[j] = c
		}
	}
	if len(sample) == 0 {
		return -1
	}
	// The best score; ties by reservoir too, so each tied node is as likely.
	best, ties := sample[0], 1
	for _, c := range sample[1:] {
		switch c.better(best) {
		case 1:
			best, ties = c, 1
		case 0:
			ties++
			if p.intNLocked(ties) == 0 {
				best = c
			}
		}
	}
	name := nodes[best.at].Name
	p.inflight[name] = p.inflight[name].add(req, 1)
	return best.at
}

// releaseLocked returns what reserve held on node for req.
func (p *Placer) releaseLocked(node string, req Request) {
	u := p.inflight[node].add(req, -1)
	if u.sandboxes <= 0 {
		delete(p.inflight, node)
		return
	}
	p.inflight[node] = u
}

// scoreLocked returns the node's score for req (the fraction of its tightest
// resource left after req, the creates in flight and the sandboxes held)
// and whether req fits.
// A node that shares its CPU (CPUAdmission Shared) is bound by memory and
// slots only, as its sandboxd is. A node under disk pressure takes nothing:
// its sandboxd refuses every create (--disk-reserve).
func (p *Placer) scoreLocked(n *v1beta1.NodeInventory, req Request) (float64, bool) {
	if n.Spec.DiskPressure {
		return 0, false
	}
	capa, alloc, fly := &n.Spec.Capacity, &n.Spec.Allocated, p.inflight[n.Name]
	if h := p.held[n.Name]; h != nil {
		for _, pl := range h.placed {
			fly = fly.add(pl.req, 1)
		}
	}
	cpu := 1.0
	if n.Spec.CPUAdmission != v1beta1.CPUShared {
		var ok bool
		if cpu, ok = left(capa.CPUMilli, alloc.CPUMilli+fly.cpuMilli+req.CPUMilli); !ok {
			return 0, false
		}
	}
	mem, ok := left(capa.MemoryMiB, alloc.MemoryMiB+fly.memoryMiB+req.MemoryMiB)
	if !ok {
		return 0, false
	}
	slots, ok := left(int64(capa.Sandboxes), int64(alloc.Sandboxes)+fly.sandboxes+1)
	if !ok {
		return 0, false
	}
	return min(cpu, mem, slots), true
}

// left returns the fraction of capacity that remains once used is taken, and
// whether used fits at all: the host's own check (sandboxd refuses a create
// past any of its limits). Nothing asked of no capacity leaves all of it.
func left(capacity, used int64) (float64, bool) {
	switch {
	case used > capacity:
		return 0, false
	case capacity == 0:
		return 1, true
	}
	return float64(capacity-used) / float64(capacity), true
}

// wants says whether req may go to node n: n lists its template (at its
// version) and req does not exclude it.
func (req *Request) wants(n *v1beta1.NodeInventory) bool {
	return hasTemplate(n, req.Template, req.Version) && (req.Exclude == nil || !req.Exclude(n.Name))
}

// hasTemplate says whether the node lists the template (at version, if
// that is set).
func hasTemplate(n *v1beta1.NodeInventory, template, version string) bool {
	for i := range n.Spec.Templates {
		if t := &n.Spec.Templates[i]; t.Name == template && (version == "" || t.Version == version) {
			return true
		}
	}
	return false
}

// intNLocked returns a uniform random int in [0, n).
func (p *Placer) intNLocked(n int) int {
	if p.rnd == nil {
		return rand.IntN(n)
	}
	return p.rnd.IntN(n)
}
