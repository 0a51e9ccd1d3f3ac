package warmpool

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// hosts is a fleet of in-memory hosts whose inventories show at once what
// they were asked to do: the driver's logic alone, against a Source.
type hosts struct {
	mu    sync.Mutex
	src   *inventory.StaticSource
	nodes map[string]*v1beta1.NodeInventory
	n     int
	full  bool
	// lagging are sandboxes gone from their host that the inventory
	// still lists (its next publish is not in yet); kills counts the
	// kill calls.
	lagging map[string]bool
	kills   int
}

func newHosts(names ...string) *hosts {
	h := &hosts{src: inventory.NewStaticSource(), nodes: map[string]*v1beta1.NodeInventory{}}
	for _, n := range names {
		h.nodes[n] = &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: n}}
		h.src.Apply(h.nodes[n])
	}
	return h
}

func (h *hosts) Warm(_ context.Context, template, pool string, _ fleet.Defaults, spread fleet.Spread) (string, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.full {
		return "", "", fmt.Errorf("no room: %w", errNoRoom)
	}
	best := ""
	for name := range h.nodes {
		if best == "" || spread.Count(name) < spread.Count(best) || (spread.Count(name) == spread.Count(best) && name < best) {
			best = name
		}
	}
	// As fleet.Backend.Warm: the chosen node counts before the sandbox
	// starts.
	spread.Add(best, 1)
	h.n++
	tag := string(sandboxid.NodeTag(best))
	id := fmt.Sprintf("%0*d", sandboxid.Len-len(tag), h.n) + tag
	inv := h.nodes[best]
	inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: id, Template: template, State: v1beta1.SandboxWarm, Pool: pool,
		StartedAt: v1beta1.NewMicroTime(time.Unix(int64(h.n), 0))})
	h.src.Apply(inv)
	return best, id, nil
}

var errNoRoom = fmt.Errorf("full")

func (h *hosts) KillOnNode(_ context.Context, node, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.kills++
	if h.lagging[id] {
		return fmt.Errorf("kill sandbox %s: %w", id, e2bapi.ErrNotFound)
	}
	inv := h.nodes[node]
	for i, e := range inv.Spec.Sandboxes {
		if e.ID == id {
			inv.Spec.Sandboxes = append(inv.Spec.Sandboxes[:i], inv.Spec.Sandboxes[i+1:]...)
			h.src.Apply(inv)
			return nil
		}
	}
	return fmt.Errorf("no sandbox %s on %s: %w", id, node, e2bapi.ErrNotFound)
}

// A warm sandbox the inventory lists but its host no longer has (claimed
// through another replica, whose publish is not in yet): trimming it is
// no error, and the driver neither kills it again nor trims a live one in
// its place while the inventory still lists it.
func TestDriverTrimsALaggingInventoryOnce(t *testing.T) {
	h := newHosts("host-a")
	ps := &pools{}
	ps.set(pool(2))
	d := New(Config{Pools: ps, Source: h.src, Fleet: h, Logger: slog.New(slog.DiscardHandler)})
	settle(t, d)
	h.mu.Lock()
	h.lagging = map[string]bool{}
	for _, e := range h.nodes["host-a"].Spec.Sandboxes {
		h.lagging[e.ID] = true
	}
	h.mu.Unlock()
	ps.set(pool(1))
	for range 3 {
		if err := d.Sync(t.Context()); err != nil {
			t.Fatalf("Sync with a lagging inventory: %v", err)
		}
		d.wg.Wait()
	}
	h.mu.Lock()
	kills := h.kills
	h.mu.Unlock()
	if kills != 1 {
		t.Fatalf("%d kill calls over three passes, want 1", kills)
	}
	// Once the inventory stops listing it, it is forgotten.
	h.mu.Lock()
	inv := h.nodes["host-a"]
	inv.Spec.Sandboxes = inv.Spec.Sandboxes[:0]
	h.src.Apply(inv)
	h.mu.Unlock()
	if err := d.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	d.wg.Wait()
	d.mu.Lock()
	n := len(d.gone)
	d.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d sandboxes still marked gone, want 0", n)
	}
}

// claim turns n warm sandboxes into a team's, as a claim does.
func (h *hosts) claim(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, inv := range h.nodes {
		for i := range inv.Spec.Sandboxes {
			if e := &inv.Spec.Sandboxes[i]; n > 0 && e.State == v1beta1.SandboxWarm {
				e.State, e.Team = v1beta1.SandboxRunning, "team-a"
				n--
			}
		}
		h.src.Apply(inv)
	}
}

// warm returns the pool's warm sandboxes by node.
func (h *hosts) warm(pool string) map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for name, inv := range h.nodes {
		for _, e := range inv.Spec.Sandboxes {
			if e.State == v1beta1.SandboxWarm && e.Pool == pool {
				out[name]++
			}
		}
	}
	return out
}

type statuses struct {
	mu   sync.Mutex
	last map[string]v1beta1.SandboxWarmPoolStatus
}

func (s *statuses) WriteStatus(_ context.Context, p Pool, st v1beta1.SandboxWarmPoolStatus) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last[p.Key] = st
	p.Object.Status = st // as the cache would show it next
	return nil
}

func (s *statuses) get(key string) v1beta1.SandboxWarmPoolStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[key]
}

type pools struct {
	mu sync.Mutex
	ps []Pool
}

func (p *pools) List(context.Context) ([]Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Pool(nil), p.ps...), nil
}

func (p *pools) set(ps ...Pool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ps = ps
}

func pool(replicas int32) Pool {
	obj := &v1beta1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: "pools", Name: "base", Generation: int64(replicas) + 1}}
	return Pool{Key: "pools/base", Template: "base", Replicas: replicas, Object: obj}
}

// settle makes passes until the driver has nothing in flight.
func settle(t *testing.T, d *Driver) {
	t.Helper()
	for range 20 {
		if err := d.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		d.wg.Wait()
		d.mu.Lock()
		busy := 0
		for _, n := range d.inflight {
			busy += n
		}
		d.mu.Unlock()
		if busy == 0 {
			if err := d.Sync(t.Context()); err != nil {
				t.Fatal(err)
			}
			d.wg.Wait()
			return
		}
	}
	t.Fatal("the driver never settled")
}

func TestDriverFillsRefillsTrimsAndReports(t *testing.T) {
	h := newHosts("k1-a", "k1-b")
	ps := &pools{}
	p := pool(4)
	ps.set(p)
	st := &statuses{last: map[string]v1beta1.SandboxWarmPoolStatus{}}
	d := New(Config{Pools: ps, Source: h.src, Fleet: h, Status: st})

	settle(t, d)
	if w := h.warm("pools/base"); w["k1-a"] != 2 || w["k1-b"] != 2 {
		t.Fatalf("a pool of 4 on two hosts: %v, want 2 and 2", w)
	}
	s := st.get("pools/base")
	if s.Ready != 4 || s.Warming != 0 || s.Replicas != 4 || s.ObservedGeneration != 5 || s.Selector != "skiff.dev/pool=base" || len(s.Conditions) != 1 ||
		s.Conditions[0].Status != metav1.ConditionTrue || s.Conditions[0].Reason != ReasonFilled {
		t.Fatalf("status %+v", s)
	}

	// Two claims: refilled to 4.
	h.claim(2)
	settle(t, d)
	if w := h.warm("pools/base"); w["k1-a"]+w["k1-b"] != 4 {
		t.Fatalf("after 2 claims: %v, want 4 again", w)
	}

	// Scale to 1: trimmed to 1.
	p1 := pool(1)
	p1.Object.Status = st.get("pools/base")
	ps.set(p1)
	settle(t, d)
	if w := h.warm("pools/base"); w["k1-a"]+w["k1-b"] != 1 {
		t.Fatalf("after scale to 1: %v", w)
	}
	if s := st.get("pools/base"); s.Ready != 1 || s.ObservedGeneration != 2 || s.Conditions[0].Status != metav1.ConditionTrue {
		t.Errorf("status after scale %+v", s)
	}

	// No room: the condition says why.
	h.mu.Lock()
	h.full = true
	h.mu.Unlock()
	p5 := pool(5)
	p5.Object.Status = st.get("pools/base")
	ps.set(p5)
	settle(t, d)
	if s := st.get("pools/base"); s.Ready != 1 || s.Conditions[0].Status != metav1.ConditionFalse || s.Conditions[0].Reason != ReasonWarmFailed {
		t.Errorf("status without room %+v", s)
	}

	// The pool is deleted: its warm sandboxes go.
	ps.set()
	settle(t, d)
	if w := h.warm("pools/base"); len(w) != 0 {
		t.Errorf("after the pool was deleted: %v", w)
	}
}

func TestParseStatic(t *testing.T) {
	got, err := ParseStatic([]string{"base=4", "py=0"})
	if err != nil || len(got) != 2 || got[0].Key != "default/base" || got[0].Replicas != 4 || got[1].Replicas != 0 {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"base", "=3", "base=-1", "base=x", "Base=1"} {
		if _, err := ParseStatic([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseStatic([]string{"base=1", "base=2"}); err == nil {
		t.Error("two pools of one template accepted")
	}
}

// A pass reads again only the nodes whose inventory changed (a new
// resourceVersion) and keeps what it read of the others; what it keeps
// still finds the warms it waits on.
func TestDriverRereadsOnlyChangedNodes(t *testing.T) {
	h := newHosts("k1-a", "k1-b")
	ps := &pools{}
	ps.set(pool(4))
	st := &statuses{last: map[string]v1beta1.SandboxWarmPoolStatus{}}
	d := New(Config{Pools: ps, Source: h.src, Fleet: h, Status: st})
	settle(t, d)
	kept := func() map[string]*nodeWarm {
		d.memoMu.Lock()
		defer d.memoMu.Unlock()
		return maps.Clone(d.memo)
	}
	before := kept()
	if err := d.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	after := kept()
	for name, m := range before {
		if after[name] != m {
			t.Errorf("node %s read again with no change", name)
		}
	}

	// k1-a's warm sandbox claimed: only k1-a is read again, and the pool
	// refills.
	h.mu.Lock()
	inv := h.nodes["k1-a"]
	for i := range inv.Spec.Sandboxes {
		if e := &inv.Spec.Sandboxes[i]; e.State == v1beta1.SandboxWarm {
			e.State, e.Team = v1beta1.SandboxRunning, "team-a"
			break
		}
	}
	h.src.Apply(inv)
	h.mu.Unlock()
	if err := d.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	after = kept()
	if after["k1-a"] == before["k1-a"] || after["k1-b"] != before["k1-b"] {
		t.Errorf("after a change to k1-a: k1-a kept %v, k1-b kept %v; want k1-a read again, k1-b kept",
			after["k1-a"] == before["k1-a"], after["k1-b"] == before["k1-b"])
	}
	settle(t, d)
	if w := h.warm("pools/base"); w["k1-a"]+w["k1-b"] != 4 {
		t.Fatalf("after a claim: %v, want 4 again", w)
	}
	d.mu.Lock()
	pending := len(d.pending)
	d.mu.Unlock()
	if pending != 0 {
		t.Errorf("%d warms still pending though the inventories list them", pending)
	}
}

// A pool named before names were limited to 63 characters has no
// selector: skiff.dev/pool=<its name> would not parse, and its sandboxes
// cannot carry the label.
func TestStatusSelectorOfALongName(t *testing.T) {
	d := &Driver{cfg: Config{Now: time.Now}, lastErr: map[string]error{}}
	for _, tc := range []struct{ name, want string }{
		{"base", "skiff.dev/pool=base"},
		{strings.Repeat("a", 63), "skiff.dev/pool=" + strings.Repeat("a", 63)},
		{strings.Repeat("a", 64), ""},
	} {
		p := Pool{Key: "pools/" + tc.name, Replicas: 1, Object: &v1beta1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: "pools"}}}
		if got := d.status(p, 1, 0).Selector; got != tc.want {
			t.Errorf("selector of a pool named %d characters = %q, want %q", len(tc.name), got, tc.want)
		}
	}
}
