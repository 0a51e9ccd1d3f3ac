package placement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

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

// Placer places sandboxes on the fleet a Source serves. It is safe for
// concurrent use, and one Placer should serve every create of a process,
// since it counts the creates it has in flight.
type Placer struct {
	src            inventory.Source
	k, attempts    int
	retryable      func(error) bool
	claimRetryable func(error) bool

	mu       sync.Mutex
	rnd      *rand.Rand       // guarded by mu; nil means the global source
	inflight map[string]usage // by node name, creates under way; guarded by mu
}

// usage is what the creates in flight on one node hold.
type usage struct{ cpuMilli, memoryMiB, sandboxes int64 }

// New returns a Placer over src. Zero fields of opts take their defaults.
func New(src inventory.Source, opts Options) *Placer {
	p := &Placer{
		src:            src,
		k:              opts.SampleSize,
		attempts:       opts.MaxAttempts,
		retryable:      opts.Retryable,
		claimRetryable: opts.ClaimRetryable,
		rnd:            opts.Rand,
		inflight:       make(map[string]usage),
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
// modify it, and should wrap a full node's refusal into ErrNodeFull and an
// unreachable node into ErrNodeUnavailable: those exclude the node and try
// another, up to Options.MaxAttempts nodes. Any other error, or one that
// arrives once ctx is done, is returned at once, wrapped with the node's name.
// With no eligible node left, Place returns an error wrapping ErrNoCapacity
// (and the last refusal, if any).
func (p *Placer) Place(ctx context.Context, req Request, create func(context.Context, *v1beta1.NodeInventory) error) (string, error) {
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
	if last == nil {
		return "", fmt.Errorf("%w: template %q, cpu %dm, memory %dMi", ErrNoCapacity, req.Template, req.CPUMilli, req.MemoryMiB)
	}
	return "", fmt.Errorf("%w: %d nodes refused, last: %w", ErrNoCapacity, len(excluded), last)
}

// create runs create on node with req reserved there, releasing the
// reservation however create ends.
func (p *Placer) create(ctx context.Context, node *v1beta1.NodeInventory, req Request, create func(context.Context, *v1beta1.NodeInventory) error) error {
	defer p.release(node.Name, req)
	return create(ctx, node)
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
		if !hasTemplate(n, req.Template, req.Version) || slices.Contains(excluded, n.Name) || req.Exclude != nil && req.Exclude(n.Name) {
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
	u := p.inflight[name]
	u.cpuMilli += req.CPUMilli
	u.memoryMiB += req.MemoryMiB
	u.sandboxes++
	p.inflight[name] = u
	return best.at
}

// release returns what reserve held on node for req.
func (p *Placer) release(node string, req Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.inflight[node]
	u.cpuMilli -= req.CPUMilli
	u.memoryMiB -= req.MemoryMiB
	u.sandboxes--
	if u.sandboxes <= 0 {
		delete(p.inflight, node)
		return
	}
	p.inflight[node] = u
}

// scoreLocked returns the node's score for req (the fraction of its tightest
// resource left after req and the creates in flight) and whether req fits.
// A node that shares its CPU (CPUAdmission Shared) is bound by memory and
// slots only, as its sandboxd is.
func (p *Placer) scoreLocked(n *v1beta1.NodeInventory, req Request) (float64, bool) {
	capa, alloc, fly := &n.Spec.Capacity, &n.Spec.Allocated, p.inflight[n.Name]
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
