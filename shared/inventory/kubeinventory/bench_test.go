package kubeinventory_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// benchLimit is how many candidates a create asks for.
const benchLimit = 8

// BenchmarkClientInventoryWarmCandidates measures the read path a warm create
// takes, on stamped inventories in a real kube-apiserver read through an
// informer cache:
//
//   - copy: WarmCandidates reading deep copies from the cache;
//   - nocopy: WarmCandidates as it ships, reading the cache's objects;
//   - fullscan: the naive reference, listing copies and scanning every
//     sandbox of every fresh inventory.
//
// One sandbox in ten is warm, of the template asked for.
func BenchmarkClientInventoryWarmCandidates(b *testing.B) {
	env := kubetest.Start(b)
	for _, size := range []struct{ nodes, sandboxes int }{{26, 100}, {200, 2000}} {
		b.Run(fmt.Sprintf("%dx%d", size.nodes, size.sandboxes), func(b *testing.B) {
			reader := fleet(b, env, size.nodes, size.sandboxes)
			src := kubeinventory.New(reader, kubeinventory.NewOptions())
			copying := kubeinventory.New(deepCopying{reader}, kubeinventory.NewOptions())
			want := min(benchLimit, size.nodes*size.sandboxes/10)

			for _, bc := range []struct {
				name string
				run  func(context.Context) (int, error)
			}{
				{"copy", func(ctx context.Context) (int, error) {
					c, err := copying.WarmCandidates(ctx, "base", benchLimit)
					return len(c), err
				}},
				{"nocopy", func(ctx context.Context) (int, error) {
					c, err := src.WarmCandidates(ctx, "base", benchLimit)
					return len(c), err
				}},
				{"fullscan", func(ctx context.Context) (int, error) { return fullScan(ctx, src, "base", benchLimit) }},
			} {
				b.Run(bc.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						n, err := bc.run(b.Context())
						if err != nil {
							b.Fatal(err)
						}
						if n != want {
							b.Fatalf("got %d candidates, want %d", n, want)
						}
					}
				})
			}
		})
	}
}

// fullScan is the naive reference: list every fresh inventory (deep copies),
// collect every warm sandbox of the template, and keep the first limit.
func fullScan(ctx context.Context, src *kubeinventory.Source, template string, limit int) (int, error) {
	invs, err := src.ListNodes(ctx)
	if err != nil {
		return 0, err
	}
	var all []kubeinventory.Candidate
	for _, inv := range invs {
		for _, sb := range inv.Spec.Sandboxes {
			if sb.State == v1beta1.SandboxWarm && sb.Template == template {
				all = append(all, kubeinventory.Candidate{Node: inv.Name, Endpoint: inv.Spec.Endpoint, SandboxID: sb.ID, Pool: sb.Pool})
			}
		}
	}
	return len(all[:min(limit, len(all))]), nil
}

// deepCopying makes the cache deep-copy every object it returns, whatever the
// caller asked for.
type deepCopying struct{ client.Reader }

func (d deepCopying) List(ctx context.Context, list client.ObjectList, _ ...client.ListOption) error {
	return d.Reader.List(ctx, list)
}

// fleet publishes nodes inventories of sandboxes each (stamped now) and
// returns a synced informer cache over them. The inventories are deleted when
// the benchmark ends.
func fleet(b *testing.B, env *kubetest.Env, nodes, sandboxes int) client.Reader {
	b.Helper()
	ctx := b.Context()
	start := time.Now()
	inParallel(b, nodes, func(i int) error { return env.Client.Create(ctx, benchInventory(i, sandboxes)) })
	// One delete per inventory: a delete-collection of 100 MB of inventories
	// outlasts the apiserver's request timeout.
	b.Cleanup(func() {
		for i := range nodes {
			if err := env.Client.Delete(context.Background(), benchInventory(i, 0)); err != nil {
				b.Errorf("delete inventory: %v", err)
			}
		}
	})

	c := env.StartCache(b, &v1beta1.NodeInventory{})
	var list v1beta1.NodeInventoryList
	if err := c.List(ctx, &list); err != nil || len(list.Items) != nodes {
		b.Fatalf("cache holds %d inventories (%v), want %d", len(list.Items), err, nodes)
	}
	b.Logf("published %d inventories of %d sandboxes and synced a cache in %s", nodes, sandboxes, time.Since(start).Round(time.Millisecond))
	return c
}

// benchInventory is node i with sandboxes entries, one in ten warm of "base".
func benchInventory(i, sandboxes int) *v1beta1.NodeInventory {
	now := metav1.Now()
	started := v1beta1.NewMicroTime(now.Time)
	end := v1beta1.NewMicroTime(now.Add(time.Hour))
	inv := &v1beta1.NodeInventory{
		ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("bench-node-%03d", i)},
		PublishedAt: &now,
		Spec: v1beta1.NodeInventorySpec{
			Endpoint:  fmt.Sprintf("10.0.%d.%d:27777", i/250, i%250+1),
			Capacity:  v1beta1.NodeCapacity{CPUMilli: 256000, MemoryMiB: 1 << 20, Sandboxes: int32(sandboxes)},
			Allocated: v1beta1.NodeCapacity{CPUMilli: int64(sandboxes) * 100, MemoryMiB: int64(sandboxes) * 256, Sandboxes: int32(sandboxes)},
			Sandboxes: make([]v1beta1.SandboxEntry, sandboxes),
		},
	}
	for j := range inv.Spec.Sandboxes {
		sb := v1beta1.SandboxEntry{
			ID: fmt.Sprintf("b%03d%016d", i, j), Template: "python", State: v1beta1.SandboxRunning,
			Team: "team-a", StartedAt: started, EndAt: &end, CPUMilli: 100, MemoryMiB: 256,
		}
		if j%10 == 9 {
			sb.Template, sb.State, sb.Team, sb.EndAt, sb.Pool = "base", v1beta1.SandboxWarm, "", nil, "pools/base"
		}
		inv.Spec.Sandboxes[j] = sb
	}
	return inv
}

// inParallel runs f(0) to f(n-1), four at a time, and fails b on the
// first error.
func inParallel(b *testing.B, n int, f func(i int) error) {
	b.Helper()
	work, errs := make(chan int), make(chan error, n)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range work {
				errs <- f(i)
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}
