package fleet

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// shallowReader lists its items the way the proxy's informer cache does
// (UnsafeDisableDeepCopy): struct copies that share every slice and string.
type shallowReader struct {
	mu    sync.Mutex
	items []v1beta1.NodeInventory
}

func (r *shallowReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := list.(*v1beta1.NodeInventoryList)
	l.Items = append(l.Items[:0], r.items...)
	return nil
}

func (r *shallowReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	panic("the index never gets one inventory")
}

// fleetOf is nodes inventories of sandboxes each, stamped now, with sorted
// IDs as hostinventory publishes them.
func fleetOf(nodes, sandboxes int) []v1beta1.NodeInventory {
	now := metav1.Now()
	out := make([]v1beta1.NodeInventory, nodes)
	for i := range out {
		name := fmt.Sprintf("bench-node-%03d", i)
		tag := string(sandboxid.NodeTag(name))
		inv := v1beta1.NodeInventory{
			ObjectMeta:  metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
			PublishedAt: &now,
			Spec:        v1beta1.NodeInventorySpec{Endpoint: fmt.Sprintf("10.0.%d.%d:27777", i/250, i%250+1)},
		}
		inv.Spec.Sandboxes = make([]v1beta1.SandboxEntry, sandboxes)
		for j := range inv.Spec.Sandboxes {
			inv.Spec.Sandboxes[j] = v1beta1.SandboxEntry{ID: fmt.Sprintf("%016d", j) + tag}
		}
		out[i] = inv
	}
	return out
}

// BenchmarkRefresh measures one rebuild of the index over 200 nodes of 2,000
// sandboxes, read through kubeinventory's freshness filter from a no-copy
// cache, which is what runs on every NodeInventory event:
//
//   - unchanged: no inventory changed since the last rebuild;
//   - republished: one node published again, same sandboxes (the common
//     event, every publish interval per node);
//   - changed: one node's sandboxes changed;
//   - cold: every node is new (the first rebuild).
func BenchmarkRefresh(b *testing.B) {
	const nodes, sandboxes = 200, 2000
	for _, mode := range []string{"unchanged", "republished", "changed", "cold"} {
		b.Run(mode, func(b *testing.B) {
			reader := &shallowReader{items: fleetOf(nodes, sandboxes)}
			x := New(kubeinventory.New(reader, kubeinventory.NewOptions()), Options{})
			if err := x.Refresh(b.Context()); err != nil {
				b.Fatal(err)
			}
			changed := append([]v1beta1.SandboxEntry(nil), reader.items[7].Spec.Sandboxes...)
			b.ReportAllocs()
			i := 1
			for b.Loop() {
				i++
				switch mode {
				case "republished":
					reader.items[7].ResourceVersion = strconv.Itoa(i)
				case "changed":
					reader.items[7].ResourceVersion = strconv.Itoa(i)
					changed[i%sandboxes].ID = fmt.Sprintf("%016d", i) + changed[i%sandboxes].ID[16:]
					reader.items[7].Spec.Sandboxes = append([]v1beta1.SandboxEntry(nil), changed...)
				case "cold":
					x.snap.Store(&snapshot{})
				}
				if err := x.Refresh(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			if x.Nodes() != nodes {
				b.Fatalf("%d nodes", x.Nodes())
			}
		})
	}
}

// BenchmarkLookup is what routing adds to a request: a sandbox on a fleet
// of 200 nodes where every tag is shared by two nodes, so the lookup also
// searches the inventories' IDs.
func BenchmarkLookup(b *testing.B) {
	items := fleetOf(200, 2000)
	twins := fleetOf(200, 2000)
	for i := range twins { // same tags, other names: every tag collides
		twins[i].Name = items[i].Name + "-twin"
	}
	for i := range items {
		twins[i].Spec.Sandboxes = twins[i].Spec.Sandboxes[:0]
	}
	x := New(&shallowList{append(items, twins...)}, Options{})
	if err := x.Refresh(b.Context()); err != nil {
		b.Fatal(err)
	}
	id := items[123].Spec.Sandboxes[1234].ID
	if n, ok := x.Lookup(id); !ok || n.Name != items[123].Name {
		b.Fatalf("Lookup = %+v, %v", n, ok)
	}
	b.ReportAllocs()
	for b.Loop() {
		x.Lookup(id)
	}
}

type shallowList struct{ items []v1beta1.NodeInventory }

func (s *shallowList) ListNodes(context.Context) ([]v1beta1.NodeInventory, error) {
	return s.items, nil
}
