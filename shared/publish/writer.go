package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
// With shards (Options.SandboxShards > 0) an inventory's sandboxes go to
// that many NodeInventoryShard objects, by a hash of their IDs
// (v1beta1.ShardOf), and the NodeInventory itself carries none: a stamp
// then writes an object of a few hundred bytes instead of every sandbox
// of the host (at 2,000 sandboxes kube-apiserver spends about half a
// second of CPU on each write of the whole inventory, stamp or not, and 2
// ms on a small one).
//
// With packed shards and Options.MaxChanges > 0, a change does not
// rewrite the shards it touches: the inventory, written on every publish
// anyway, carries the host's changes since its shards were written
// (spec.sandboxChanges), and readers apply them on top of the shards. A
// publish folds them into the shards (rewriting those that differ, under
// a new fold number) when there would be more than MaxChanges, when a
// shard's stored content is unknown, and when it would otherwise only
// stamp the inventory.
type KubeWriter struct {
	res    dynamic.NamespaceableResourceInterface
	shards dynamic.NamespaceableResourceInterface
	// nshards is how many shards an inventory's sandboxes are split into;
	// 0: none.
	nshards int
	// format is how a shard holds them.
	format ShardFormat
	// maxChanges bounds spec.sandboxChanges; 0: never written.
	maxChanges int
	// now is the clock fold numbers start from.
	now func() time.Time
	// metrics may be nil.
	metrics *Metrics
	// log tells when a host's shards grow past nshards.
	log *slog.Logger

	mu      sync.Mutex
	written map[string]*hostState // by inventory name
	// grown is, by inventory name, the shards a host's sandboxes went to
	// when nshards could not hold them (split).
	grown map[string]int
	// fold is the last fold number given out, by any host's fold.
	fold int64
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
	// fold is the newest fold number of the shards written; changes are
	// on top of it.
	fold int64
	// shardsRV is the newest resourceVersion a shard's write left (0:
	// none known), which the inventory's writes carry.
	shardsRV uint64
	// changes is how many changes the inventory's last write carried: a
	// stamp folds them first.
	changes int
	// refusedCarries counts the inventory's writes in a row that failed
	// while carrying changes: past one, the next write folds them.
	refusedCarries int
}

// NewKubeWriter returns a writer over client that keeps inventories as
// opts say: their sandboxes split into opts.SandboxShards
// NodeInventoryShards (0: none, the sandboxes stay in the NodeInventory;
// at most v1beta1.MaxInventoryShards), each holding them in
// opts.ShardFormat (ShardsPacked unless it is ShardsStructured), and up
// to opts.MaxChanges changes carried in the inventory between folds.
func NewKubeWriter(client dynamic.Interface, opts Options) *KubeWriter {
	format := opts.ShardFormat
	if format != ShardsStructured {
		format = ShardsPacked
	}
	maxChanges := min(max(opts.MaxChanges, 0), v1beta1.MaxShardEntries)
	if format != ShardsPacked {
		maxChanges = 0
	}
	return &KubeWriter{
		res:        client.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)),
		shards:     client.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryShardResource)),
		nshards:    min(max(opts.SandboxShards, 0), v1beta1.MaxInventoryShards),
		format:     format,
		maxChanges: maxChanges,
		now:        time.Now,
		written:    map[string]*hostState{},
		grown:      map[string]int{},
		log:        slog.New(slog.DiscardHandler),
	}
}

// WithLogger makes w log to log; it returns w.
func (w *KubeWriter) WithLogger(log *slog.Logger) *KubeWriter {
	w.log = log
	return w
}

// WithMetrics makes w count its shard writes and folds, and the changes
// its inventory carries, in m; it returns w.
func (w *KubeWriter) WithMetrics(m *Metrics) *KubeWriter {
	w.metrics = m
	return w
}

// Apply server-side-applies inv. With shards, it either writes the
// inventory alone, carrying the changes since the shards were written,
// or folds: writes each shard whose sandboxes differ from what this
// writer last wrote there, then the inventory without changes. The
// inventory's write comes last, so a reader woken by it sees the shards
// written with it. The first time, the writer asks for the stored
// inventory's UID, which its shards name as their owner, and writes every
// shard; only when there is no stored inventory yet (and after the stored
// one was replaced, its shards gone with it) does the inventory come
// first, and then every shard.
func (w *KubeWriter) Apply(ctx context.Context, inv *v1beta1.NodeInventory) error {
	return w.write(ctx, inv, false)
}

// write applies inv, folding its changes into the shards with fold.
func (w *KubeWriter) write(ctx context.Context, inv *v1beta1.NodeInventory, fold bool) error {
	n := w.nshards
	if len(inv.Name) > v1beta1.MaxShardedNodeName {
		n = 0 // its shards' names would be too long
	}
	head := *inv
	var parts [][]v1beta1.SandboxEntry
	if n > 0 {
		parts, n = w.split(inv.Name, inv.Spec.Sandboxes, n)
		head.Spec.Sandboxes = nil
		head.Spec.SandboxShards = int32(n)
	}
	owner := w.owner(inv.Name)
	if owner == "" && n > 0 {
		// Not written by this writer yet: if the inventory is stored (a
		// restarted host), its shards are written first, as always, so
		// that no reader sees the inventory without the changes it
		// carried before they are in the shards.
		var err error
		if owner, err = w.storedOwner(ctx, inv.Name); err != nil {
			return err
		}
	}
	carried, count := false, 0
	if owner != "" && n > 0 && !fold {
		head.Spec.SandboxChanges, count, carried = w.changes(inv.Name, parts)
	}
	var number int64
	if !carried {
		number = w.nextFold()
		if owner != "" {
			if err := w.applyShards(ctx, inv.Name, parts, owner, number); err != nil {
				return err
			}
		}
	}
	if n > 0 {
		// Tells a reader which shard writes it must have seen to join
		// this inventory (spec.shardsResourceVersion).
		head.Spec.ShardsResourceVersion = w.shardsRV(inv.Name)
	}
	out, err := w.apply(ctx, w.res, "NodeInventory", inv.Name, &head)
	w.remember(inv.Name, out, err)
	w.rememberChanges(inv.Name, count, err)
	if err != nil {
		return err
	}
	if n > 0 && w.maxChanges > 0 {
		// A write that carries no changes folded whatever it carried.
		w.metrics.inventoryWritten(count, !carried && owner != "")
	}
	if out.GetUID() != owner {
		// A new inventory (the first write, or the stored one was replaced
		// and its shards went with it): every shard, under a fold after any
		// changes it carries.
		if carried {
			number = w.nextFold()
		}
		return w.applyShards(ctx, inv.Name, parts, out.GetUID(), number)
	}
	return nil
}

// entryFixedBytes bounds what one SandboxEntry takes in a stored shard
// beside its strings: field names, quotes, times, numbers and commas, as
// spec.packed holds them and the stored object quotes them again
// (TestEntryBound).
const entryFixedBytes = 512

// entryBound bounds the bytes entry e takes in a stored shard (or
// inventory's changes), whatever its strings hold: a byte of a string is
// at most 7 there (a character JSON escapes, \u003c, whose backslash the
// stored object escapes again), a metadata pair's quotes and colon and
// comma 10. It counts bytes and does not trust the entry to be within
// the CRD's bounds, which nothing checks of a packed entry before a
// reader's Validate (an envd restored from a tenant's snapshot reports its
// own version).
func entryBound(e *v1beta1.SandboxEntry) int {
	n := entryFixedBytes + 7*(len(e.ID)+len(e.Template)+len(e.State)+len(e.Pool)+len(e.Team)+len(e.EnvdVersion))
	for k, v := range e.Metadata {
		n += 7*(len(k)+len(v)) + 10
	}
	return n
}

// maxCarriedBytes bounds the changes an inventory carries, as stored:
// half a shard's, since the inventory holds more beside them (the IDs
// removed, up to 1,024 snapshots and volumes) within etcd's 1.5 MiB.
const maxCarriedBytes = v1beta1.MaxPackedBytes / 2

// storedBytes is what packed (JSON) takes as a string of the stored
// object, which escapes each of its quotes and backslashes again: what
// etcd's request limit (1.5 MiB) and the CRD's maxLength (1 MiB of
// characters) bound.
func storedBytes(packed string) int {
	return len(packed) + strings.Count(packed, `"`) + strings.Count(packed, `\`)
}

// split puts entries into the shards of node, n (> 0) of them as
// configured, or more when a shard would not fit its bounds: more than
// v1beta1.MaxShardEntries entries, or more than v1beta1.MaxPackedBytes as
// stored (storedBytes; a host with thousands of sandboxes in few shards,
// their metadata long). The kube-apiserver refuses such a shard, and a host
// whose shards cannot be written stops publishing: its sandboxes would
// leave every reader's view. So the count doubles until every shard fits
// (up to v1beta1.MaxInventoryShards), readers follow
// spec.sandboxShards, and the host keeps the larger count for as long as
// this writer runs (skiff_vk_sandbox_inventory_shards shows it).
func (w *KubeWriter) split(node string, entries []v1beta1.SandboxEntry, n int) ([][]v1beta1.SandboxEntry, int) {
	w.mu.Lock()
	n = max(n, w.grown[node])
	w.mu.Unlock()
	for {
		parts := make([][]v1beta1.SandboxEntry, n)
		for _, e := range entries {
			k := v1beta1.ShardOf(e.ID, n)
			parts[k] = append(parts[k], e)
		}
		if n >= v1beta1.MaxInventoryShards || !slices.ContainsFunc(parts, tooLarge) {
			w.mu.Lock()
			grew := n > max(w.nshards, w.grown[node])
			if grew {
				w.grown[node] = n
			}
			w.mu.Unlock()
			if grew {
				w.log.Warn("a NodeInventoryShard would pass its bounds (4,096 sandboxes, 1 MiB): the host's sandboxes go to more shards from now on; raise --publish-sandbox-shards",
					"node", node, "sandboxes", len(entries), "shards", n, "publish_sandbox_shards", w.nshards)
			}
			w.metrics.shardsUsed(n)
			return parts, n
		}
		n = min(2*n, v1beta1.MaxInventoryShards)
	}
}

// tooLarge reports whether a shard of part would pass a shard's bounds.
// Entries are packed to be measured only when their bound passes it.
func tooLarge(part []v1beta1.SandboxEntry) bool {
	if len(part) > v1beta1.MaxShardEntries {
		return true
	}
	bound := 0
	for i := range part {
		bound += entryBound(&part[i])
	}
	if bound <= v1beta1.MaxPackedBytes {
		return false
	}
	packed, err := v1beta1.PackSandboxes(part)
	return err == nil && storedBytes(packed) > v1beta1.MaxPackedBytes
}

// storedOwner is the UID of node's stored inventory, which its shards
// name as their owner; "" when there is none. It asks by an empty merge
// patch, which writes nothing: a host may patch its own inventory but not
// read the fleet's.
func (w *KubeWriter) storedOwner(ctx context.Context, node string) (types.UID, error) {
	out, err := w.res.Patch(ctx, node, types.MergePatchType, []byte("{}"), metav1.PatchOptions{FieldManager: FieldManager})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("find the stored NodeInventory %s: %w", node, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written[node] == nil {
		w.written[node] = &hostState{uid: out.GetUID()}
	}
	return out.GetUID(), nil
}

// nextFold is a fold number greater than any this writer gave out: the
// clock's microseconds, so that a restarted writer's folds come after its
// predecessor's.
func (w *KubeWriter) nextFold() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fold = max(w.fold+1, w.now().UnixMicro())
	return w.fold
}

// changes is what node's inventory carries when its sandboxes are parts
// (by shard) and its shards are as last written: each entry that differs
// from or is missing in its shard, and the ID of each entry of a shard
// that is no longer in parts, with their count. ok is false when it
// cannot carry them: no changes are kept, a shard's content is unknown,
// or there are more than maxChanges. No change is a nil SandboxChanges.
func (w *KubeWriter) changes(node string, parts [][]v1beta1.SandboxEntry) (_ *v1beta1.SandboxChanges, count int, ok bool) {
	if w.maxChanges == 0 {
		return nil, 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.written[node]
	if st == nil || st.refusedCarries > 1 || len(st.shards) != len(parts) {
		// Unknown, or the inventory's writes failed twice in a row while
		// carrying changes: a write refused for what it carries would be
		// refused again at every publish. (Once may be a passing failure,
		// which a fold would answer with a write of every shard.)
		return nil, 0, false
	}
	var changed []v1beta1.SandboxEntry
	var removed []string
	for k, part := range parts {
		if st.shards[k] == nil {
			return nil, 0, false
		}
		stored := *st.shards[k]
		if equality.Semantic.DeepEqual(stored, part) {
			continue
		}
		was := make(map[string]int, len(stored))
		for i := range stored {
			was[stored[i].ID] = i
		}
		is := make(map[string]struct{}, len(part))
		for i := range part {
			is[part[i].ID] = struct{}{}
			if j, ok := was[part[i].ID]; !ok || !equality.Semantic.DeepEqual(stored[j], part[i]) {
				changed = append(changed, part[i])
			}
		}
		for i := range stored {
			if _, ok := is[stored[i].ID]; !ok {
				removed = append(removed, stored[i].ID)
			}
		}
		if len(changed)+len(removed) > w.maxChanges {
			return nil, 0, false
		}
	}
	count = len(changed) + len(removed)
	if count == 0 {
		return nil, 0, true
	}
	packed, err := v1beta1.PackSandboxes(changed)
	if err != nil || storedBytes(packed) > maxCarriedBytes {
		// Folded instead, where the shard's write reports an error, and
		// where shards hold what the inventory cannot.
		return nil, 0, false
	}
	return &v1beta1.SandboxChanges{Fold: st.fold, Packed: packed, Removed: removed}, count, true
}

// applyShards writes each of node's shards (parts, by index) that differs
// from what this writer last wrote there, owned by the inventory of UID
// owner, as fold number.
func (w *KubeWriter) applyShards(ctx context.Context, node string, parts [][]v1beta1.SandboxEntry, owner types.UID, number int64) error {
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
		if w.maxChanges > 0 {
			sh.Spec.Fold = number
		}
		out, err := w.apply(ctx, w.shards, "NodeInventoryShard", sh.Name, sh)
		w.rememberShard(node, len(parts), k, part, number, out, err)
		if err != nil {
			return err
		}
		w.metrics.shardWritten()
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
// fails it (409) rather than being stamped as fresh. An inventory that
// carries changes is not stamped but folded: its shards are written, then
// the inventory without them.
func (w *KubeWriter) Stamp(ctx context.Context, inv *v1beta1.NodeInventory) error {
	if w.carriesChanges(inv.Name) {
		// Nothing newer to publish: the changes go to the shards, and the
		// inventory stamped every interval is small again.
		return w.write(ctx, inv, true)
	}
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
		st.uid, st.shards, st.shardsRV = uid, nil, 0
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

// rememberShard keeps what shard k of name (of n) was written with, as
// fold number, and the resourceVersion the write left (out), or makes it
// unknown after a failed write.
func (w *KubeWriter) rememberShard(name string, n, k int, part []v1beta1.SandboxEntry, number int64, out *unstructured.Unstructured, err error) {
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
	st.fold = max(st.fold, number)
	if rv, perr := strconv.ParseUint(out.GetResourceVersion(), 10, 64); perr == nil {
		st.shardsRV = max(st.shardsRV, rv)
	}
}

// shardsRV is the newest resourceVersion a write of name's shards left,
// as spec.shardsResourceVersion spells it; "": none known.
func (w *KubeWriter) shardsRV(name string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.written[name]; st != nil && st.shardsRV > 0 {
		return strconv.FormatUint(st.shardsRV, 10)
	}
	return ""
}

// rememberChanges keeps how many changes the inventory's write carried;
// after a failed one, that it may carry some.
func (w *KubeWriter) rememberChanges(name string, count int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.written[name]
	if st == nil {
		return
	}
	switch {
	case err == nil:
		st.refusedCarries = 0
	case count > 0:
		st.refusedCarries++
	}
	if err != nil {
		count = max(count, st.changes, 1)
	}
	st.changes = count
}

// carriesChanges reports whether name's stored inventory may carry
// changes, as this writer last wrote it.
func (w *KubeWriter) carriesChanges(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.written[name]
	return st != nil && st.changes > 0
}
