package placement_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
)

// res is an amount of host resources.
func res(cpuMilli, memoryMiB int64, sandboxes int32) v1beta1.NodeCapacity {
	return v1beta1.NodeCapacity{CPUMilli: cpuMilli, MemoryMiB: memoryMiB, Sandboxes: sandboxes}
}

// node returns the inventory of a host with the given capacity and
// allocation that can start the templates.
func node(name string, capacity, allocated v1beta1.NodeCapacity, templates ...string) *v1beta1.NodeInventory {
	inv := &v1beta1.NodeInventory{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint:  name + ":27777",
			Capacity:  capacity,
			Allocated: allocated,
		},
	}
	for _, t := range templates {
		inv.Spec.Templates = append(inv.Spec.Templates, v1beta1.TemplateVersion{Name: t, Version: "v1"})
	}
	return inv
}

// recorder is a create that records the nodes it is called on and fails on
// those in fail.
type recorder struct {
	mu    sync.Mutex
	calls []string
	fail  map[string]error
}

func (r *recorder) create(_ context.Context, n *v1beta1.NodeInventory) (placement.Created, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, n.Name)
	return placement.Created{}, r.fail[n.Name]
}

func (r *recorder) called() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// seeded returns options with a fixed random source.
func seeded(k, attempts int) placement.Options {
	return placement.Options{SampleSize: k, MaxAttempts: attempts, Rand: rand.New(rand.NewPCG(1, 2))}
}

var errBoom = errors.New("boom")

// TestPlaceEligible proves that only nodes with the template and room in
// every resource (allocation included, an exact fit allowed) are tried, the
// freest first when K covers the fleet.
func TestPlaceEligible(t *testing.T) {
	capa := res(4000, 4096, 10)
	src := inventory.NewStaticSource(
		node("fits", capa, res(0, 0, 1), "base", "py"),
		node("exact", capa, res(3000, 0, 0), "base"),
		node("cpu-full", capa, res(3001, 0, 0), "base"),
		node("mem-full", capa, res(0, 3500, 0), "base"),
		node("slots-full", capa, res(0, 0, 10), "base"),
		node("other-template", capa, res(0, 0, 0), "py"),
		node("no-templates", capa, res(0, 0, 0)),
		node("no-capacity", res(0, 0, 0), res(0, 0, 0), "base"),
	)
	for _, tc := range []struct {
		name string
		req  placement.Request
		want []string // in order of score
	}{
		{"base", placement.Request{Template: "base", CPUMilli: 1000, MemoryMiB: 1024}, []string{"fits", "exact"}},
		{"py", placement.Request{Template: "py", CPUMilli: 1000, MemoryMiB: 1024}, []string{"other-template", "fits"}},
		{"nothing asked", placement.Request{Template: "base"}, []string{"fits", "exact", "cpu-full", "mem-full"}},
		{"unknown template", placement.Request{Template: "go"}, nil},
		{"at its version", placement.Request{Template: "base", Version: "v1"}, []string{"fits", "exact", "cpu-full", "mem-full"}},
		{"at another version", placement.Request{Template: "base", Version: "v2"}, nil},
		{"excluded", placement.Request{Template: "base", Exclude: func(n string) bool { return n == "fits" || n == "cpu-full" }}, []string{"exact", "mem-full"}},
		{"too big for all", placement.Request{Template: "base", CPUMilli: 4001}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every node refuses, so Place tries every eligible node once.
			r := &recorder{fail: map[string]error{}}
			for _, n := range []string{"fits", "exact", "cpu-full", "mem-full", "slots-full", "other-template", "no-templates", "no-capacity"} {
				r.fail[n] = fmt.Errorf("sandboxd: %w", placement.ErrNodeFull)
			}
			p := placement.New(src, seeded(100, 100))
			got, err := p.Place(t.Context(), tc.req, r.create)
			if got != "" || !errors.Is(err, placement.ErrNoCapacity) {
				t.Fatalf("Place = %q, %v; want ErrNoCapacity", got, err)
			}
			if want := len(tc.want) > 0; errors.Is(err, placement.ErrNodeFull) != want {
				t.Errorf("Place error %q: wraps the last refusal = %v, want %v", err, !want, want)
			}
			if calls := r.called(); !slices.Equal(calls, tc.want) {
				t.Fatalf("create called on %v, want %v", calls, tc.want)
			}
			if n := p.InFlight(); n != 0 {
				t.Fatalf("%d creates still in flight", n)
			}
		})
	}
}

// A node that shares its CPU takes sandboxes past its cores, as its
// sandboxd does, and is still bound by memory and slots.
func TestPlaceSharedCPU(t *testing.T) {
	capa := res(2000, 4096, 4)
	shared := func(n *v1beta1.NodeInventory) *v1beta1.NodeInventory {
		n.Spec.CPUAdmission = v1beta1.CPUShared
		return n
	}
	src := inventory.NewStaticSource(
		node("reserved", capa, res(2000, 0, 1), "base"),
		shared(node("shared", capa, res(16000, 1024, 2), "base")),
		shared(node("shared-mem-full", capa, res(0, 4000, 1), "base")),
		shared(node("shared-slots-full", capa, res(0, 0, 4), "base")),
	)
	r := &recorder{fail: map[string]error{}}
	for _, n := range []string{"reserved", "shared", "shared-mem-full", "shared-slots-full"} {
		r.fail[n] = fmt.Errorf("sandboxd: %w", placement.ErrNodeFull)
	}
	p := placement.New(src, seeded(100, 100))
	if _, err := p.Place(t.Context(), placement.Request{Template: "base", CPUMilli: 2000, MemoryMiB: 512}, r.create); !errors.Is(err, placement.ErrNoCapacity) {
		t.Fatalf("Place = %v", err)
	}
	if calls := r.called(); !slices.Equal(calls, []string{"shared"}) {
		t.Fatalf("create called on %v, want only the node that shares its CPU and has memory and a slot", calls)
	}
}

// A node whose disk is below its reserve refuses every create: placement
// leaves it out, however much room it has, as kube-scheduler does a node
// with DiskPressure. Its volume store's pressure does not bind sandboxes.
func TestPlaceDiskPressure(t *testing.T) {
	capa := res(64000, 64<<10, 64)
	pressed := func(n *v1beta1.NodeInventory) *v1beta1.NodeInventory {
		n.Spec.DiskPressure = true
		return n
	}
	volumes := func(n *v1beta1.NodeInventory) *v1beta1.NodeInventory {
		n.Spec.VolumeDiskPressure = true
		return n
	}
	src := inventory.NewStaticSource(
		pressed(node("empty-but-full-disk", capa, res(0, 0, 0), "base")),
		node("busy", capa, res(60000, 60<<10, 60), "base"),
		volumes(node("volumes-full", capa, res(62000, 62<<10, 62), "base")),
	)
	r := &recorder{fail: map[string]error{"busy": fmt.Errorf("sandboxd: %w", placement.ErrNodeFull), "volumes-full": fmt.Errorf("sandboxd: %w", placement.ErrNodeFull)}}
	p := placement.New(src, seeded(100, 100))
	_, err := p.Place(t.Context(), placement.Request{Template: "base", CPUMilli: 1000, MemoryMiB: 512}, r.create)
	if !errors.Is(err, placement.ErrNoCapacity) || !strings.Contains(err.Error(), "left out, their disk below its reserve: empty-but-full-disk") {
		t.Fatalf("Place = %v, want no capacity naming the node left out", err)
	}
	if calls := r.called(); !slices.Equal(calls, []string{"busy", "volumes-full"}) {
		t.Fatalf("create called on %v, want the emptiest node without disk pressure, then the next, never the one under pressure", calls)
	}
}

// TestPlaceCountsInFlight proves that creates in flight hold their resources:
// of N concurrent creates on a node with room for exactly M, M run and the
// rest find no capacity; once they end, the room is back.
func TestPlaceCountsInFlight(t *testing.T) {
	const n, m = 10, 3
	src := inventory.NewStaticSource(node("small", res(m*1000, 1<<20, 100), res(0, 0, 0), "base"))
	p := placement.New(src, placement.Options{})
	req := placement.Request{Template: "base", CPUMilli: 1000, MemoryMiB: 256}

	// Each Place reports once: when its create starts (and then blocks until
	// released), or when it returns without a create.
	type event struct {
		entered bool
		err     error
	}
	events, release := make(chan event, 2*n), make(chan struct{})
	create := func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		events <- event{entered: true}
		<-release
		return placement.Created{}, nil
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := p.Place(t.Context(), req, create); err != nil {
				events <- event{err: err}
			}
		})
	}
	entered := 0
	for range n {
		e := <-events
		switch {
		case e.entered:
			entered++
		case !errors.Is(e.err, placement.ErrNoCapacity):
			t.Errorf("Place = %v, want ErrNoCapacity", e.err)
		}
	}
	if entered != m {
		t.Errorf("%d creates ran at once on a node with room for %d", entered, m)
	}
	if got := p.InFlight(); got != entered {
		t.Errorf("in flight = %d, want %d", got, entered)
	}
	close(release)
	wg.Wait()
	close(events)
	for e := range events {
		t.Errorf("after release: %+v, want every create that ran to succeed", e)
	}
	if got := p.InFlight(); got != 0 {
		t.Fatalf("in flight after every create returned = %d, want 0", got)
	}
	if _, err := p.Place(t.Context(), req, func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		return placement.Created{}, nil
	}); err != nil {
		t.Fatalf("Place after the creates returned = %v, want success", err)
	}
}

// TestPlaceInFlightSpills proves that creates in flight steer the next ones
// elsewhere: a small node that scores best when empty never holds more
// concurrent creates than fit, and the others go to a big node.
func TestPlaceInFlightSpills(t *testing.T) {
	const n, m = 20, 3
	src := inventory.NewStaticSource(
		node("small", res(m*1000, 1<<20, 100), res(0, 0, 0), "base"),
		node("big", res(100_000, 1<<20, 100), res(50_000, 0, 0), "base"),
	)
	p := placement.New(src, placement.Options{SampleSize: 2})
	req := placement.Request{Template: "base", CPUMilli: 1000, MemoryMiB: 256}

	var mu sync.Mutex
	running, peak := map[string]int{}, map[string]int{}
	// Each Place reports once: nil when its create starts (and then blocks
	// until released), or its error when it returns without a create.
	events, release := make(chan error, 2*n), make(chan struct{})
	create := func(_ context.Context, node *v1beta1.NodeInventory) (placement.Created, error) {
		mu.Lock()
		running[node.Name]++
		peak[node.Name] = max(peak[node.Name], running[node.Name])
		mu.Unlock()
		events <- nil
		<-release
		mu.Lock()
		running[node.Name]--
		mu.Unlock()
		return placement.Created{}, nil
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := p.Place(t.Context(), req, create); err != nil {
				events <- err
			}
		})
	}
	for range n {
		if err := <-events; err != nil {
			t.Errorf("Place = %v, want every create to run at once", err)
		}
	}
	close(release)
	wg.Wait()
	close(events)
	for err := range events {
		t.Errorf("Place = %v after release, want success", err)
	}
	if peak["small"] < 1 || peak["small"] > m || peak["big"] < n-m {
		t.Fatalf("peak creates in flight = %v, want 1..%d on small and the rest on big", peak, m)
	}
}

// ranked returns n nodes, "n0" the freest and each next one fuller.
func ranked(n int) *inventory.StaticSource {
	src := inventory.NewStaticSource()
	for i := range n {
		src.Apply(node(fmt.Sprintf("n%d", i), res(10_000, 1<<20, 1000), res(int64(i)*500, 0, 0), "base"))
	}
	return src
}

// TestPlaceRetries proves that a node refusing with a retryable error is
// excluded and the next best tried (K covers the fleet, so the order is by
// score), that other errors stop at once, and that attempts are bounded.
func TestPlaceRetries(t *testing.T) {
	full := fmt.Errorf("sandboxd: %w", placement.ErrNodeFull)
	gone := fmt.Errorf("dial: %w", placement.ErrNodeUnavailable)
	errBusy := errors.New("busy")
	for _, tc := range []struct {
		name      string
		opts      placement.Options
		fail      map[string]error
		want      string
		wantCalls []string
		wantErr   []error
	}{
		{"first succeeds", seeded(5, 3), nil, "n0", []string{"n0"}, nil},
		{"full then gone then success", seeded(5, 3), map[string]error{"n0": full, "n1": gone},
			"n2", []string{"n0", "n1", "n2"}, nil},
		{"non-retryable stops", seeded(5, 3), map[string]error{"n0": errBoom},
			"", []string{"n0"}, []error{errBoom}},
		{"bounded attempts", seeded(10, 4), map[string]error{"n0": gone, "n1": gone, "n2": gone, "n3": gone, "n4": gone},
			"", []string{"n0", "n1", "n2", "n3"}, []error{placement.ErrNoCapacity, placement.ErrNodeUnavailable}},
		{"custom classifier retries", placement.Options{SampleSize: 10, Retryable: func(err error) bool { return errors.Is(err, errBusy) }},
			map[string]error{"n0": errBusy}, "n1", []string{"n0", "n1"}, nil},
		{"custom classifier replaces the default", placement.Options{SampleSize: 10, Retryable: func(err error) bool { return errors.Is(err, errBusy) }},
			map[string]error{"n0": full}, "", []string{"n0"}, []error{placement.ErrNodeFull}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{fail: tc.fail}
			p := placement.New(ranked(5), tc.opts)
			got, err := p.Place(t.Context(), placement.Request{Template: "base", CPUMilli: 100}, r.create)
			if got != tc.want {
				t.Errorf("Place = %q, %v; want node %q", got, err, tc.want)
			}
			if (err != nil) != (len(tc.wantErr) > 0) {
				t.Errorf("Place error = %v, want one wrapping %v", err, tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("Place error = %v, want it to wrap %v", err, want)
				}
			}
			if slices.Contains(tc.wantErr, errBoom) && errors.Is(err, placement.ErrNoCapacity) {
				t.Errorf("Place error = %v: a non-retryable error is not ErrNoCapacity", err)
			}
			if calls := r.called(); !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("create called on %v, want %v", calls, tc.wantCalls)
			}
			if n := p.InFlight(); n != 0 {
				t.Errorf("%d creates still in flight", n)
			}
		})
	}
}

// failingSource is a Source whose listing fails.
type failingSource struct{ inventory.Source }

var errList = errors.New("list failed")

func (failingSource) ListNodes(context.Context) ([]v1beta1.NodeInventory, error) {
	return nil, errList
}

func (failingSource) ListNodesShared(context.Context) ([]v1beta1.NodeInventory, error) {
	return nil, errList
}

func (failingSource) WarmCandidates(context.Context, string, int) ([]inventory.Candidate, error) {
	return nil, errList
}

// TestPlaceNoCapacity proves that an empty fleet (none, or every node gone
// stale) is ErrNoCapacity without a create, and a failing source is not.
func TestPlaceNoCapacity(t *testing.T) {
	emptied := inventory.NewStaticSource(node("a", res(1000, 1000, 1), res(0, 0, 0), "base"))
	emptied.Remove("a") // as a stale node leaves a kubeinventory source
	for _, tc := range []struct {
		name string
		src  inventory.Source
		want error
	}{
		{"no nodes", inventory.NewStaticSource(), placement.ErrNoCapacity},
		{"every node gone", emptied, placement.ErrNoCapacity},
		{"source fails", failingSource{}, errList},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			got, err := placement.New(tc.src, placement.Options{}).Place(t.Context(), placement.Request{Template: "base"}, r.create)
			if got != "" || !errors.Is(err, tc.want) {
				t.Fatalf("Place = %q, %v; want %v", got, err, tc.want)
			}
			if errors.Is(err, placement.ErrNoCapacity) != errors.Is(tc.want, placement.ErrNoCapacity) {
				t.Fatalf("Place = %v: wraps ErrNoCapacity = %v, want %v", err, !errors.Is(tc.want, placement.ErrNoCapacity), errors.Is(tc.want, placement.ErrNoCapacity))
			}
			if calls := r.called(); len(calls) != 0 {
				t.Fatalf("create called on %v, want none", calls)
			}
		})
	}
}

// TestPlaceContext proves that a done context stops placement: before any
// create, and after a create that failed because of it, with no retry.
func TestPlaceContext(t *testing.T) {
	req := placement.Request{Template: "base"}
	t.Run("canceled before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		r := &recorder{}
		_, err := placement.New(ranked(3), placement.Options{}).Place(ctx, req, r.create)
		if !errors.Is(err, context.Canceled) || len(r.called()) != 0 {
			t.Fatalf("Place = %v after %v, want context.Canceled and no create", err, r.called())
		}
	})
	t.Run("canceled during create", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		calls := 0
		p := placement.New(ranked(3), placement.Options{})
		_, err := p.Place(ctx, req, func(ctx context.Context, _ *v1beta1.NodeInventory) (placement.Created, error) {
			calls++
			cancel()
			return placement.Created{}, fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, ctx.Err())
		})
		if calls != 1 || errors.Is(err, placement.ErrNoCapacity) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Place = %v after %d creates, want the create's error after 1", err, calls)
		}
		if n := p.InFlight(); n != 0 {
			t.Fatalf("%d creates still in flight", n)
		}
	})
}

// TestPlacePanicReleases proves a create that panics gives its reservation
// back.
func TestPlacePanicReleases(t *testing.T) {
	p := placement.New(ranked(1), placement.Options{})
	func() {
		defer func() { _ = recover() }()
		_, _ = p.Place(t.Context(), placement.Request{Template: "base"}, func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
			panic("create")
		})
	}()
	if n := p.InFlight(); n != 0 {
		t.Fatalf("%d creates still in flight after a panic", n)
	}
}

func TestPlaceNegativeRequest(t *testing.T) {
	r := &recorder{}
	_, err := placement.New(ranked(3), placement.Options{}).Place(t.Context(), placement.Request{Template: "base", CPUMilli: -1}, r.create)
	if err == nil || errors.Is(err, placement.ErrNoCapacity) || len(r.called()) != 0 {
		t.Fatalf("Place = %v after %v, want a request error and no create", err, r.called())
	}
}

// binomial returns n choose k.
func binomial(n, k int) float64 {
	if k < 0 || k > n {
		return 0
	}
	b := 1.0
	for i := range k {
		b = b * float64(n-i) / float64(i+1)
	}
	return b
}

// TestPlaceSampling proves, statistically and with a fixed seed, that Place
// samples K eligible nodes uniformly and takes the freest: the node ranked r
// (from 0, the freest) of N is chosen with probability C(N-1-r, K-1)/C(N, K),
// so the K-1 fullest are never chosen; and that ties are broken at random.
func TestPlaceSampling(t *testing.T) {
	const nodes, runs = 10, 20_000
	identical := inventory.NewStaticSource()
	for i := range nodes {
		identical.Apply(node(fmt.Sprintf("n%d", i), res(10_000, 1<<20, 1000), res(0, 0, 0), "base"))
	}
	for _, tc := range []struct {
		name string
		src  *inventory.StaticSource
		k    int
		want func(rank int) float64
	}{
		{"K=1 is uniform", ranked(nodes), 1, func(int) float64 { return 1.0 / nodes }},
		{"K=3 prefers the freer", ranked(nodes), 3, func(r int) float64 { return binomial(nodes-1-r, 2) / binomial(nodes, 3) }},
		{"K=10 is the freest", ranked(nodes), 10, func(r int) float64 { return map[bool]float64{true: 1}[r == 0] }},
		{"ties at random", identical, 3, func(int) float64 { return 1.0 / nodes }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := placement.New(listed(t, tc.src), seeded(tc.k, 1))
			rank := map[string]int{}
			for i := range nodes {
				rank[fmt.Sprintf("n%d", i)] = i
			}
			var counts [nodes]int
			create := func(_ context.Context, n *v1beta1.NodeInventory) (placement.Created, error) {
				counts[rank[n.Name]]++
				return placement.Created{}, nil
			}
			for range runs {
				if _, err := p.Place(t.Context(), placement.Request{Template: "base", CPUMilli: 100}, create); err != nil {
					t.Fatal(err)
				}
			}
			for r, got := range counts {
				want := tc.want(r) * runs
				// Five standard deviations of a binomial count, plus one.
				tol := 5*math.Sqrt(want*(1-want/runs)) + 1
				if d := float64(got) - want; d > tol || d < -tol {
					t.Errorf("node of rank %d chosen %d times in %d, want %.0f ± %.0f", r, got, runs, want, tol)
				}
			}
		})
	}
}

// listedSource is a Source that lists one fixed slice of inventories without
// copying them, so that tests and benchmarks measure placement and not the
// copies a StaticSource makes. Placement only reads what it lists.
type listedSource struct {
	*inventory.StaticSource
	nodes []v1beta1.NodeInventory
}

func (s listedSource) ListNodes(context.Context) ([]v1beta1.NodeInventory, error) {
	return s.nodes, nil
}

// listed returns a listedSource over src's nodes as they are now.
func listed(tb testing.TB, src *inventory.StaticSource) listedSource {
	tb.Helper()
	nodes, err := src.ListNodes(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	return listedSource{StaticSource: src, nodes: nodes}
}

// TestPlaceSpread proves that Request.Spread puts a pool's sandbox on the
// node with the fewest of them, even a fuller one, and that the score
// breaks ties.
func TestPlaceSpread(t *testing.T) {
	src := inventory.NewStaticSource(
		node("empty", res(8000, 8192, 10), res(0, 0, 0), "base"),
		node("busy", res(8000, 8192, 10), res(6000, 6000, 6), "base"),
		node("freer", res(8000, 8192, 10), res(1000, 1000, 1), "base"),
	)
	p := placement.New(src, seeded(3, 3))
	have := map[string]int{"empty": 2, "busy": 0, "freer": 2}
	req := placement.Request{Template: "base", CPUMilli: 500, MemoryMiB: 256, Spread: func(n string) int { return have[n] }}
	ok := func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		return placement.Created{}, nil
	}
	if got, err := p.Place(t.Context(), req, ok); err != nil || got != "busy" {
		t.Errorf("Place = %s, %v; want busy, which has none of the pool", got, err)
	}
	have["busy"] = 2
	if got, err := p.Place(t.Context(), req, ok); err != nil || got != "empty" {
		t.Errorf("Place on a tie = %s, %v; want empty, the freest", got, err)
	}
}
