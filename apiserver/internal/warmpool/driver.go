// Package warmpool drives warm pools to their targets: it counts each
// pool's warm sandboxes in the fresh inventories, plus the warms it has
// started that the inventories do not show yet, asks placement's nodes to
// warm more (spread across nodes) when a pool has too few, kills the
// newest when it has too many, kills warm sandboxes whose pool is gone,
// and reports each pool's status.
//
// In Kubernetes mode the pools are SandboxWarmPool objects and one replica
// drives them, the holder of a Lease (Campaign); in single-host mode they
// come from --warm-pool and the driver always runs.
package warmpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// Defaults of Config.
const (
	DefaultInterval      = 2 * time.Second
	DefaultMaxConcurrent = 4
	DefaultPendingTTL    = 90 * time.Second
)

// Pool is one warm pool as the driver sees it.
type Pool struct {
	// Key is namespace/name, what sandboxd records as a warm sandbox's pool.
	Key      string
	Template string
	Replicas int32
	// Resources override the template's where not zero.
	Resources fleet.Defaults
	// Object is the SandboxWarmPool, nil for a pool from a flag.
	Object *v1beta1.SandboxWarmPool
}

// Pools lists the pools to drive.
type Pools interface {
	List(ctx context.Context) ([]Pool, error)
}

// Fleet warms and kills sandboxes; *fleet.Backend is one.
type Fleet interface {
	Warm(ctx context.Context, template, pool string, override fleet.Defaults, spread fleet.Spread) (node, id string, err error)
	KillOnNode(ctx context.Context, node, id string) error
}

// StatusWriter writes a pool's status.
type StatusWriter interface {
	WriteStatus(ctx context.Context, p Pool, st v1beta1.SandboxWarmPoolStatus) error
}

// Config configures a Driver.
type Config struct {
	Pools  Pools
	Source inventory.Source
	Fleet  Fleet
	// Status writes pools' status; nil writes none (pools from flags).
	Status StatusWriter
	// Interval bounds the time between passes; ≤ 0 is DefaultInterval.
	Interval time.Duration
	// MaxConcurrent bounds the warms in flight per pool; ≤ 0 is
	// DefaultMaxConcurrent.
	MaxConcurrent int
	// PendingTTL is how long a warm the driver started counts toward its
	// pool before an inventory shows it; ≤ 0 is DefaultPendingTTL.
	PendingTTL time.Duration
	Logger     *slog.Logger
	Now        func() time.Time
}

// Driver drives pools. It is safe for concurrent use.
type Driver struct {
	cfg    Config
	log    *slog.Logger
	notify chan struct{}

	mu sync.Mutex
	// pending are warms the driver started that no inventory showed yet,
	// by sandbox ID.
	pending map[string]pendingWarm
	// inflight counts the Warm calls under way, by pool.
	inflight map[string]int
	// lastErr is each pool's last warm error, "" after a success.
	lastErr map[string]error
	// gone are warm sandboxes the driver killed, or found gone when it
	// tried, that an inventory may list a while yet (a host's next
	// publish, a reader's lagging cache): they no longer count toward
	// their pool, so that a pass neither kills them again nor trims a
	// live one in their place. By ID, with when.
	gone map[string]time.Time

	// memoMu holds memo, what the last pass kept of each node.
	memoMu sync.Mutex
	memo   map[string]*nodeWarm

	wg sync.WaitGroup
	// runMu makes Runs one at a time: a lost lease's Run ends (and waits
	// for its warms) before the next lease's starts.
	runMu sync.Mutex
}

type pendingWarm struct {
	pool, node string
	at         time.Time
}

// New returns a Driver.
func New(cfg Config) *Driver {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.PendingTTL <= 0 {
		cfg.PendingTTL = DefaultPendingTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Driver{cfg: cfg, log: cfg.Logger, notify: make(chan struct{}, 1),
		pending: map[string]pendingWarm{}, inflight: map[string]int{}, lastErr: map[string]error{}, gone: map[string]time.Time{}}
}

// Notify asks for a pass soon; it never blocks.
func (d *Driver) Notify() {
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// Run makes a pass at once, then on every Notify and at least every
// Interval, until ctx ends; then it waits for the warms in flight.
func (d *Driver) Run(ctx context.Context) {
	d.runMu.Lock()
	defer d.runMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	defer d.wg.Wait()
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		if err := d.Sync(ctx); err != nil && ctx.Err() == nil {
			d.log.WarnContext(ctx, "warm-pool pass", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-d.notify:
		case <-t.C:
		}
	}
}

// warmEntry is a warm sandbox of a pool on a node.
type warmEntry struct {
	node, id string
	started  time.Time
}

// Sync makes one pass over every pool. The warms it starts run on after
// it returns (their end triggers another pass).
func (d *Driver) Sync(ctx context.Context) error {
	pools, err := d.cfg.Pools.List(ctx)
	if err != nil {
		return fmt.Errorf("list warm pools: %w", err)
	}
	nodes, err := d.cfg.Source.ListNodesShared(ctx) // only read
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	byPool := map[string][]warmEntry{}
	seen := d.watched()
	d.memoMu.Lock()
	memo := d.remember(nodes)
	for _, m := range memo {
		for _, w := range m.warm {
			if !d.isGone(w.id) {
				byPool[w.pool] = append(byPool[w.pool], w.warmEntry)
			}
		}
	}
	if len(seen) > 0 {
		// A sandbox ID ends in its node's tag: only the nodes of a
		// watched ID's tag can list it.
		byTag := make(map[sandboxid.Tag][]*nodeWarm, len(memo))
		for _, m := range memo {
			byTag[m.tag] = append(byTag[m.tag], m)
		}
		for id := range seen {
			if len(id) != sandboxid.Len {
				continue
			}
			for _, m := range byTag[sandboxid.Tag(id[sandboxid.Len-sandboxid.TagLen:])] {
				if m.lists(id) {
					seen[id] = true
					break
				}
			}
		}
	}
	d.memoMu.Unlock()
	d.forgetPending(seen)
	d.forgetGone(seen)

	known := map[string]bool{}
	var errs []error
	for _, p := range pools {
		known[p.Key] = true
		if err := d.syncPool(ctx, p, byPool[p.Key]); err != nil {
			errs = append(errs, err)
		}
	}
	// Warm sandboxes whose pool is gone.
	for key, entries := range byPool {
		if known[key] {
			continue
		}
		for _, e := range entries {
			if err := d.kill(ctx, e); err != nil {
				errs = append(errs, fmt.Errorf("kill warm sandbox %s of deleted pool %s: %w", e.id, key, err))
				continue
			}
			d.log.InfoContext(ctx, "killed a warm sandbox of a pool that is gone", "pool", key, "node", e.node, "sandbox", e.id)
		}
	}
	return errors.Join(errs...)
}

// nodeWarm is what a pass keeps of one node at one joined resourceVersion
// (which moves with any change to what the node lists): its owned warm
// sandboxes of a pool, and the IDs it owns, gathered when a pass first
// asks. A pass reads again only the nodes whose version moved, not every
// sandbox of the fleet on every inventory event.
type nodeWarm struct {
	rv    string
	tag   sandboxid.Tag
	warm  []poolWarm
	owned []v1beta1.SandboxEntry // the cache's entries, only read
	ids   map[string]struct{}
}

// poolWarm is a warm sandbox of pool.
type poolWarm struct {
	pool string
	warmEntry
}

// lists reports whether the node owns the sandbox id.
func (m *nodeWarm) lists(id string) bool {
	if m.ids == nil {
		m.ids = make(map[string]struct{}, len(m.owned))
		for i := range m.owned {
			m.ids[m.owned[i].ID] = struct{}{}
		}
	}
	_, ok := m.ids[id]
	return ok
}

// remember returns what the pass keeps of each of nodes, in their order:
// the last pass's for a node at the same resourceVersion, else read anew.
// It forgets the nodes not in nodes. Under memoMu.
func (d *Driver) remember(nodes []v1beta1.NodeInventory) []*nodeWarm {
	next := make(map[string]*nodeWarm, len(nodes))
	out := make([]*nodeWarm, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		m := d.memo[n.Name]
		if m == nil || n.ResourceVersion == "" || m.rv != n.ResourceVersion {
			m = &nodeWarm{rv: n.ResourceVersion, tag: sandboxid.NodeTag(n.Name), owned: inventory.Owned(n)}
			for _, e := range m.owned {
				if e.State == v1beta1.SandboxWarm && e.Pool != "" {
					m.warm = append(m.warm, poolWarm{pool: e.Pool, warmEntry: warmEntry{node: n.Name, id: e.ID, started: e.StartedAt.Time}})
				}
			}
		}
		next[n.Name], out[i] = m, m
	}
	d.memo = next
	return out
}

// listed says, of the sandboxes the driver waits on (its pending warms
// and those it killed), which the inventories list: a pass looks up only
// these, rather than building a set of every sandbox of the fleet (at 200
// hosts × 2,000, most of sandbox-apiserver's CPU). An ID not in it was not
// asked about.
type listed map[string]bool

// watched returns the IDs the next pass looks for, none listed yet.
func (d *Driver) watched() listed {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := make(listed, len(d.pending)+len(d.gone))
	for id := range d.pending {
		l[id] = false
	}
	for id := range d.gone {
		l[id] = false
	}
	return l
}

// forgetPending drops the pending warms an inventory now shows (warm, or
// already claimed) and those past their TTL.
func (d *Driver) forgetPending(seen listed) {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, p := range d.pending {
		if seen[id] || now.Sub(p.at) > d.cfg.PendingTTL {
			delete(d.pending, id)
		}
	}
}

// counts returns the pool's pending warms by node (and in all) and its
// warms in flight.
func (d *Driver) counts(pool string) (map[string]int, int, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	byNode := map[string]int{}
	n := 0
	for _, p := range d.pending {
		if p.pool == pool {
			byNode[p.node]++
			n++
		}
	}
	return byNode, n, d.inflight[pool]
}

func (d *Driver) syncPool(ctx context.Context, p Pool, warm []warmEntry) error {
	pendingByNode, pending, inflight := d.counts(p.Key)
	target := int(p.Replicas)
	have := len(warm) + pending + inflight
	var errs []error
	switch {
	case have < target && inflight == 0:
		spread := map[string]int{}
		for _, e := range warm {
			spread[e.node]++
		}
		for node, n := range pendingByNode {
			spread[node] += n
		}
		d.startWarms(ctx, p, target-have, spread)
	case len(warm)+pending > target && len(warm) > 0:
		errs = append(errs, d.trim(ctx, p, warm, min(len(warm), len(warm)+pending-target)))
	}
	if d.cfg.Status == nil || p.Object == nil {
		return errors.Join(errs...)
	}
	_, pending, inflight = d.counts(p.Key)
	st := d.status(p, len(warm), pending+inflight)
	if err := d.cfg.Status.WriteStatus(ctx, p, st); err != nil {
		errs = append(errs, fmt.Errorf("write status of pool %s: %w", p.Key, err))
	}
	return errors.Join(errs...)
}

// startWarms starts n warms in the background, in at most MaxConcurrent
// workers. spread is the pool's sandboxes by node, shared by the workers:
// each warm counts there from the moment its node is chosen, so that the
// next goes elsewhere.
func (d *Driver) startWarms(ctx context.Context, p Pool, n int, spread map[string]int) {
	count := &spreadCount{by: spread}
	workers := min(n, d.cfg.MaxConcurrent)
	d.mu.Lock()
	d.inflight[p.Key] += n
	d.mu.Unlock()
	for w := range workers {
		todo := n/workers + btoi(w < n%workers)
		d.wg.Go(func() {
			for range todo {
				node, id, err := d.cfg.Fleet.Warm(ctx, p.Template, p.Key, p.Resources, count)
				d.warmDone(ctx, p, node, id, err)
			}
		})
	}
}

// spreadCount is a fleet.Spread over a map, safe for concurrent use.
type spreadCount struct {
	mu sync.Mutex
	by map[string]int
}

func (s *spreadCount) Count(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.by[node]
}

func (s *spreadCount) Add(node string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.by[node] += n
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// warmDone records the end of one warm of p.
func (d *Driver) warmDone(ctx context.Context, p Pool, node, id string, err error) {
	d.mu.Lock()
	d.inflight[p.Key]--
	prev := d.lastErr[p.Key]
	if err == nil {
		d.pending[id] = pendingWarm{pool: p.Key, node: node, at: d.cfg.Now()}
		delete(d.lastErr, p.Key)
	} else if ctx.Err() == nil {
		d.lastErr[p.Key] = err
	}
	d.mu.Unlock()
	switch {
	case err == nil:
		d.log.InfoContext(ctx, "warmed a sandbox", "pool", p.Key, "template", p.Template, "node", node, "sandbox", id)
		d.Notify()
	case ctx.Err() != nil:
	case prev == nil || prev.Error() != err.Error():
		// A pool that cannot fill says why once, not every pass.
		d.log.WarnContext(ctx, "warm a sandbox for a pool", "pool", p.Key, "template", p.Template, "error", err)
	}
}

// kill kills a warm sandbox and marks it gone; one its host no longer has
// (claimed, or killed already: the inventory that listed it is behind) is
// gone too, and no error.
func (d *Driver) kill(ctx context.Context, e warmEntry) error {
	err := d.cfg.Fleet.KillOnNode(ctx, e.node, e.id)
	if err != nil && !errors.Is(err, e2bapi.ErrNotFound) {
		return err
	}
	if err != nil {
		d.log.DebugContext(ctx, "a warm sandbox to kill was gone already", "node", e.node, "sandbox", e.id)
	}
	d.mu.Lock()
	d.gone[e.id] = d.cfg.Now()
	d.mu.Unlock()
	return nil
}

func (d *Driver) isGone(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.gone[id]
	return ok
}

// forgetGone drops the gone sandboxes no inventory lists any more, and
// those older than the pending TTL (a sandbox listed that long after its
// kill is counted again, and killed again if need be).
func (d *Driver) forgetGone(seen listed) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.cfg.Now()
	for id, at := range d.gone {
		// A sandbox killed since the pass began was not asked about.
		if l, asked := seen[id]; asked && !l || now.Sub(at) > d.cfg.PendingTTL {
			delete(d.gone, id)
		}
	}
}

// trim kills n of the pool's warm sandboxes: the newest, from the nodes
// that hold the most of the pool.
func (d *Driver) trim(ctx context.Context, p Pool, warm []warmEntry, n int) error {
	perNode := map[string]int{}
	for _, e := range warm {
		perNode[e.node]++
	}
	var errs []error
	for range n {
		i := 0
		for j := range warm {
			a, b := warm[j], warm[i]
			if c := cmp.Or(cmp.Compare(perNode[a.node], perNode[b.node]), a.started.Compare(b.started), strings.Compare(a.id, b.id)); c > 0 {
				i = j
			}
		}
		e := warm[i]
		warm = slices.Delete(warm, i, i+1)
		perNode[e.node]--
		if err := d.kill(ctx, e); err != nil {
			errs = append(errs, fmt.Errorf("trim pool %s: kill %s on %s: %w", p.Key, e.id, e.node, err))
			continue
		}
		d.log.InfoContext(ctx, "trimmed a warm sandbox", "pool", p.Key, "node", e.node, "sandbox", e.id)
	}
	return errors.Join(errs...)
}

// Condition reasons of a pool's Ready condition.
const (
	ReasonFilled     = "Filled"
	ReasonFilling    = "Filling"
	ReasonNoCapacity = "NoCapacity"
	ReasonWarmFailed = "WarmFailed"
)

// status is the pool's status from its counts.
func (d *Driver) status(p Pool, ready, warming int) v1beta1.SandboxWarmPoolStatus {
	target := int(p.Replicas)
	st := v1beta1.SandboxWarmPoolStatus{
		ObservedGeneration: p.Object.Generation,
		Replicas:           int32(ready + warming),
		Ready:              int32(ready),
		Warming:            int32(warming),
	}
	// A pool made before names were limited to 63 characters has no
	// label its sandboxes could carry, so no selector either.
	if len(validation.IsValidLabelValue(p.Object.Name)) == 0 {
		st.Selector = sbv1.PoolLabel + "=" + p.Object.Name
	}
	d.mu.Lock()
	lastErr := d.lastErr[p.Key]
	d.mu.Unlock()
	msg := fmt.Sprintf("%d of %d warm sandboxes ready, %d warming", ready, target, warming)
	reason := ReasonFilling
	switch {
	case ready >= target:
		reason = ReasonFilled
	case lastErr != nil && errors.Is(lastErr, placement.ErrNoCapacity):
		reason, msg = ReasonNoCapacity, msg+": no fresh node holds the template with room for another: "+lastErr.Error()
	case lastErr != nil:
		reason, msg = ReasonWarmFailed, msg+": "+lastErr.Error()
	}
	status := "False"
	if ready >= target {
		status = "True"
	}
	st.Conditions = setCondition(p.Object.Status.Conditions, v1beta1.SandboxWarmPoolConditionReady, status, reason, msg, p.Object.Generation, d.cfg.Now())
	return st
}
