package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Stamper is a Writer that can write an inventory's publishedAt alone,
// for a publish whose spec is the one it wrote last: a request of a
// hundred bytes instead of the whole inventory (up to 1 MiB), and no
// server-side apply to merge.
type Stamper interface {
	// Stamp writes inv.PublishedAt, and nothing else, to the stored
	// inventory if it is still the one this writer wrote last; else it
	// writes nothing and returns an error wrapping ErrStale.
	Stamp(ctx context.Context, inv *v1beta1.NodeInventory) error
}

// ErrStale is returned by Stamp when the stored inventory is not the one
// the writer wrote last (changed or deleted by someone else, or never
// written by it): the whole inventory must be applied.
var ErrStale = errors.New("the stored inventory is not the one last written")

// errNeverWritten is ErrStale for an inventory this writer has not written
// (or whose last write failed): nothing to report.
var errNeverWritten = fmt.Errorf("%w: not written by this writer yet", ErrStale)

// KubeWriter applies NodeInventories by server-side apply, as field
// manager vk-sandbox with force: the host's publisher owns every field it
// sends, and a field it stops sending (a sandbox that went) is removed.
// Its stamps are JSON merge patches of publishedAt, conditional on the
// resourceVersion of its last write.
//
// With shards (NewKubeWriter's shards > 0) an inventory's sandboxes go to
// that many NodeInventoryShard objects, by a hash of their IDs (ShardOf),
// and the NodeInventory itself carries none: a stamp then writes an object
// of a few hundred bytes instead of every sandbox of the host (at 2,000
// sandboxes kube-apiserver spends about half a second of CPU on each write
// of the whole inventory, stamp or not, and 2 ms on a small one), and a
// change rewrites only the shards whose entries changed.
type KubeWriter struct {
	res    dynamic.NamespaceableResourceInterface
	shards dynamic.NamespaceableResourceInterface
	// nshards is how many shards an inventory's sandboxes are split into;
	// 0: none.
	nshards int
	// format is how a shard holds them.
	format ShardFormat

	mu      sync.Mutex
	written map[string]*hostState // by inventory name
}

// hostState is what this writer last wrote of one host.
type hostState struct {
	// rv is the resourceVersion of the inventory's last write; empty
	// after a failed one.
	rv string
	// uid is the stored inventory's, which owns its shards.
	uid types.UID
	// shards[k] is shard k's sandboxes as last written; nil: unknown
	// (never written, or its last write failed).
	shards []*[]v1beta1.SandboxEntry
}

// NewKubeWriter returns a writer over client that splits each inventory's
// sandboxes into shards NodeInventoryShards (0: none, the sandboxes stay
// in the NodeInventory; at most v1beta1.MaxInventoryShards), each holding
// them in format (ShardsPacked unless it is ShardsStructured).
func NewKubeWriter(client dynamic.Interface, shards int, format ShardFormat) *KubeWriter {
	if format != ShardsStructured {
		format = ShardsPacked
	}
	return &KubeWriter{
		res:     client.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)),
		shards:  client.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryShardResource)),
		nshards: min(max(shards, 0), v1beta1.MaxInventoryShards),
		format:  format,
		written: map[string]*hostState{},
	}
}

// ShardOf is the shard of n that holds the sandbox id: FNV-1a of the ID,
// modulo n.
func ShardOf(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// Apply server-side-applies inv. With shards, it writes each shard whose
// sandboxes differ from what this writer last wrote there, then the
// inventory without its sandboxes: the inventory's write comes last, so
// a reader woken by it sees the shards written with it. The first time
// (and after the stored inventory was replaced) the inventory comes
// first, since its shards name it as their owner, and then every shard.
func (w *KubeWriter) Apply(ctx context.Context, inv *v1beta1.NodeInventory) error {
	n := w.nshards
	if len(inv.Name) > v1beta1.MaxShardedNodeName {
		n = 0 // its shards' names would be too long
	}
	head := *inv
	var parts [][]v1beta1.SandboxEntry
	if n > 0 {
		parts = make([][]v1beta1.SandboxEntry, n)
		for _, e := range inv.Spec.Sandboxes {
			k := ShardOf(e.ID, n)
			parts[k] = append(parts[k], e)
		}
		head.Spec.Sandboxes = nil
		head.Spec.SandboxShards = int32(n)
	}
	owner := w.owner(inv.Name)
	if owner != "" {
		if err := w.applyShards(ctx, inv.Name, parts, owner); err != nil {
			return err
		}
	}
	out, err := w.apply(ctx, w.res, "NodeInventory", inv.Name, &head)
	w.remember(inv.Name, out, err)
	if err != nil {
		return err
	}
	if out.GetUID() != owner {
		return w.applyShards(ctx, inv.Name, parts, out.GetUID())
	}
	return nil
}

// applyShards writes each of node's shards (parts, by index) that differs
// from what this writer last wrote there, owned by the inventory of UID
// owner.
func (w *KubeWriter) applyShards(ctx context.Context, node string, parts [][]v1beta1.SandboxEntry, owner types.UID) error {
	for k, part := range parts {
		if w.wrote(node, k, part) {
			continue
		}
		sh := &v1beta1.NodeInventoryShard{
			ObjectMeta: metav1.ObjectMeta{
				Name: v1beta1.ShardName(node, k),
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory", Name: node, UID: owner,
				}},
			},
			Spec: v1beta1.NodeInventoryShardSpec{Node: node, Index: int32(k), Sandboxes: part},
		}
		if w.format == ShardsPacked {
			packed, err := v1beta1.PackSandboxes(part)
			if err != nil {
				return err
			}
			sh.Spec.Sandboxes, sh.Spec.Packed = nil, packed
		}
		_, err := w.apply(ctx, w.shards, "NodeInventoryShard", sh.Name, sh)
		w.rememberShard(node, len(parts), k, part, err)
		if err != nil {
			return err
		}
	}
	return nil
}

// owner is the UID of node's stored inventory as this writer last wrote
// it; empty: unknown.
func (w *KubeWriter) owner(node string) types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.written[node]; st != nil {
		return st.uid
	}
	return ""
}

// apply server-side-applies obj, of kind, to res.
func (w *KubeWriter) apply(ctx context.Context, res dynamic.NamespaceableResourceInterface, kind, name string, obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", kind, name, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(v1beta1.GroupVersion.String())
	u.SetKind(kind)
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	out, err := res.Apply(ctx, name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", kind, name, err)
	}
	return out, nil
}

// Stamp implements Stamper: the stored object's resourceVersion is the
// patch's precondition, so a change by anyone else since the last write
// fails it (409) rather than being stamped as fresh.
func (w *KubeWriter) Stamp(ctx context.Context, inv *v1beta1.NodeInventory) error {
	rv := w.lastRV(inv.Name)
	if rv == "" {
		return fmt.Errorf("stamp NodeInventory %s: %w", inv.Name, errNeverWritten)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": rv}, "publishedAt": inv.PublishedAt})
	if err != nil {
		return err
	}
	out, err := w.res.Patch(ctx, inv.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
	w.remember(inv.Name, out, err)
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		// Someone else changed or deleted it: its shards may have been
		// changed or deleted too, and the whole inventory is written again.
		w.forget(inv.Name)
		return fmt.Errorf("stamp NodeInventory %s: %w (%w)", inv.Name, ErrStale, err)
	case err != nil:
		return fmt.Errorf("stamp NodeInventory %s: %w", inv.Name, err)
	}
	return nil
}

// remember keeps the resourceVersion a write of the inventory left, or
// forgets it after a failed one (its outcome is unknown). A stored
// inventory other than the one last written (deleted and made again,
// perhaps with its shards by the garbage collector) makes every shard
// unknown.
func (w *KubeWriter) remember(name string, out *unstructured.Unstructured, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.written[name]
	if st == nil {
		st = &hostState{}
		w.written[name] = st
	}
	if err != nil || out == nil {
		st.rv = ""
		return
	}
	st.rv = out.GetResourceVersion()
	if uid := out.GetUID(); uid != st.uid {
		st.uid, st.shards = uid, nil
	}
}

// forget makes everything of name's unknown: the next write is whole.
func (w *KubeWriter) forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.written, name)
}

// lastRV is the resourceVersion of name's last write; empty: unknown.
func (w *KubeWriter) lastRV(name string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.written[name]; st != nil {
		return st.rv
	}
	return ""
}

// wrote reports whether shard k of name holds part as last written.
func (w *KubeWriter) wrote(name string, k int, part []v1beta1.SandboxEntry) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.written[name]
	if st == nil || k >= len(st.shards) || st.shards[k] == nil {
		return false
	}
	return equality.Semantic.DeepEqual(*st.shards[k], part)
}

// rememberShard keeps what shard k of name (of n) was written with, or
// makes it unknown after a failed write.
func (w *KubeWriter) rememberShard(name string, n, k int, part []v1beta1.SandboxEntry, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.written[name]
	if st == nil {
		return
	}
	if len(st.shards) != n {
		st.shards = make([]*[]v1beta1.SandboxEntry, n)
	}
	if err != nil {
		st.shards[k] = nil
		return
	}
	st.shards[k] = &part
}
