package kubeinventory_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	skiffpublish "github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// shardedHost is a host's inventory of n sandboxes, one in five warm.
func shardedHost(node string, n int) *v1beta1.NodeInventory {
	stamp := metav1.Now()
	inv := &v1beta1.NodeInventory{
		ObjectMeta:  metav1.ObjectMeta{Name: node},
		PublishedAt: &stamp,
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: "127.0.0.1:27777",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 64000, MemoryMiB: 65536, Sandboxes: 1000},
		},
	}
	tag := string(sandboxid.NodeTag(node))
	for i := range n {
		e := v1beta1.SandboxEntry{
			ID: fmt.Sprintf("%0*d", 20-len(tag), i) + tag, Template: "base", State: v1beta1.SandboxRunning,
			Team: "team-a", StartedAt: v1beta1.NewMicroTime(stamp.Time), Metadata: map[string]string{"i": fmt.Sprint(i)},
		}
		if i%5 == 0 {
			e.State, e.Team = v1beta1.SandboxWarm, ""
		}
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, e)
	}
	return inv
}

// controlPlane starts a real kube-apiserver for t, which make mutate
// skips (SKIFF_MUTATE): its unit tests alone must kill every mutant.
func controlPlane(t *testing.T) *kubetest.Env {
	t.Helper()
	if os.Getenv("SKIFF_MUTATE") != "" {
		t.Skip("SKIFF_MUTATE is set: make mutate requires the unit tests alone to kill every mutant")
	}
	return kubetest.Start(t)
}

// metric is the value of the counter or gauge skiff_vk_sandbox_<name> in
// reg; 0 when it has none.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "skiff_vk_sandbox_"+name {
			m := f.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// ids is the set of the sandbox IDs of inv.
func ids(inv *v1beta1.NodeInventory) map[string]bool {
	out := map[string]bool{}
	for _, e := range inv.Spec.Sandboxes {
		out[e.ID] = true
	}
	return out
}

// Hosts publish their sandboxes in shards (publish.KubeWriter) to a real
// kube-apiserver; readers, through an informer cache, see each fresh host
// with all its sandboxes joined, a change to one shard as a new
// resourceVersion of the host, and a stale host's shards leave with it.
// The stored inventory holds no sandbox, and a stamp writes no shard.
func TestControlPlaneShardsJoined(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(env.Config)
	format := skiffpublish.ShardsPacked
	w := skiffpublish.NewKubeWriter(dyn, skiffpublish.Options{SandboxShards: 4, ShardFormat: format})

	live, dead := shardedHost("node-live", 300), shardedHost("node-dead", 40)
	for _, inv := range []*v1beta1.NodeInventory{live, dead} {
		if err := w.Apply(ctx, inv); err != nil {
			t.Fatal(err)
		}
	}
	var stored v1beta1.NodeInventory
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-live"}, &stored); err != nil {
		t.Fatal(err)
	}
	if len(stored.Spec.Sandboxes) != 0 || stored.Spec.SandboxShards != 4 {
		t.Fatalf("stored inventory: %d sandboxes, %d shards; want 0 and 4", len(stored.Spec.Sandboxes), stored.Spec.SandboxShards)
	}
	shardRVs := func() map[string]string {
		var list v1beta1.NodeInventoryShardList
		if err := env.Client.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, sh := range list.Items {
			out[sh.Name] = sh.ResourceVersion
			if len(sh.OwnerReferences) != 1 || sh.OwnerReferences[0].Kind != "NodeInventory" || sh.OwnerReferences[0].Name != sh.Spec.Node {
				t.Errorf("shard %s: owners %+v, want its NodeInventory", sh.Name, sh.OwnerReferences)
			}
			packed, err := sh.Spec.UnpackedSandboxes()
			if err != nil {
				t.Errorf("shard %s: %v", sh.Name, err)
			}
			if sh.Spec.Node == "node-live" && (len(packed) > 0) != (format == skiffpublish.ShardsPacked) ||
				sh.Spec.Node == "node-live" && (len(sh.Spec.Sandboxes) > 0) != (format == skiffpublish.ShardsStructured) {
				t.Errorf("shard %s: %d packed and %d listed sandboxes, want them all %s", sh.Name, len(packed), len(sh.Spec.Sandboxes), format)
			}
			for _, e := range append(sh.Spec.Sandboxes, packed...) {
				if v1beta1.ShardOf(e.ID, 4) != int(sh.Spec.Index) {
					t.Errorf("sandbox %s is in shard %d, hashes to %d", e.ID, sh.Spec.Index, v1beta1.ShardOf(e.ID, 4))
				}
			}
		}
		return out
	}
	before := shardRVs()
	if len(before) != 8 {
		t.Fatalf("%d shards stored, want 4 per host: %v", len(before), slices.Sorted(maps.Keys(before)))
	}

	c := env.StartCache(t, &v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{})
	opts := kubeinventory.NewOptions()
	opts.StaleAfter = 3 * time.Second
	src := kubeinventory.New(c, opts)
	tracked := trackedSource(t, c, c, opts)
	// eventually waits until node's joined inventory, as ListNodes reads
	// it, satisfies ok, for a Source that reads every shard and for one
	// that reads only those with events (as the servers' does).
	eventually := func(what string, ok func(nodes map[string]*v1beta1.NodeInventory) bool) map[string]*v1beta1.NodeInventory {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var nodes map[string]*v1beta1.NodeInventory
			all := true
			for _, src := range []*kubeinventory.Source{tracked, src} {
				invs, err := src.ListNodes(ctx)
				if err != nil {
					t.Fatal(err)
				}
				nodes = map[string]*v1beta1.NodeInventory{}
				for i := range invs {
					nodes[invs[i].Name] = &invs[i]
				}
				all = all && ok(nodes)
			}
			if all {
				return nodes
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	nodes := eventually("both hosts joined whole", func(n map[string]*v1beta1.NodeInventory) bool {
		return len(n) == 2 && n["node-live"] != nil && maps.Equal(ids(n["node-live"]), ids(live)) && n["node-dead"] != nil && maps.Equal(ids(n["node-dead"]), ids(dead))
	})
	rv0 := nodes["node-live"].ResourceVersion
	one, err := src.NodeInventory(ctx, "node-live")
	if err != nil || !maps.Equal(ids(one), ids(live)) {
		t.Fatalf("NodeInventory(node-live): %v; %d sandboxes, want %d", err, len(one.Spec.Sandboxes), len(live.Spec.Sandboxes))
	}
	// ListNodes' copies are the caller's own: writing to one changes no
	// other reader's.
	one.Spec.Sandboxes[0].Metadata["i"] = "scribbled"
	if again, _ := src.NodeInventory(ctx, "node-live"); again.Spec.Sandboxes[0].Metadata["i"] == "scribbled" {
		t.Fatal("a caller's write to a joined inventory reached the cache")
	}
	cands, err := src.WarmCandidates(ctx, "base", 100)
	if err != nil || len(cands) != 60+8 {
		t.Fatalf("WarmCandidates = %d, %v; want the 68 warm sandboxes of both hosts' shards", len(cands), err)
	}

	// A sandbox goes: one shard is rewritten, and readers see it, with a
	// newer resourceVersion for the host.
	gone := live.Spec.Sandboxes[7].ID
	live.Spec.Sandboxes = slices.Delete(live.Spec.Sandboxes, 7, 8)
	if err := w.Apply(ctx, live); err != nil {
		t.Fatal(err)
	}
	after := shardRVs()
	var changed []string
	for name, rv := range after {
		if before[name] != rv {
			changed = append(changed, name)
		}
	}
	if want := v1beta1.ShardName("node-live", v1beta1.ShardOf(gone, 4)); !slices.Equal(changed, []string{want}) {
		t.Fatalf("shards rewritten for one sandbox gone: %v, want only %s", changed, want)
	}
	nodes = eventually("the sandbox gone", func(n map[string]*v1beta1.NodeInventory) bool {
		return n["node-live"] != nil && !ids(n["node-live"])[gone] && len(n["node-live"].Spec.Sandboxes) == 299
	})
	if nodes["node-live"].ResourceVersion == rv0 {
		t.Fatalf("node-live's resourceVersion stayed %s after a shard changed", rv0)
	}

	// Stamps write the inventory alone; node-dead stops and leaves with
	// its shards, while node-live keeps all of its.
	deadline := time.Now().Add(30 * time.Second)
	for {
		time.Sleep(500 * time.Millisecond)
		at := metav1.Now()
		live.PublishedAt = &at
		if err := w.Stamp(ctx, live); err != nil {
			t.Fatal(err)
		}
		if err := src.Observe(ctx); err != nil { // as the readers do on every inventory event
			t.Fatal(err)
		}
		if _, err := src.NodeInventory(ctx, "node-dead"); apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node-dead did not leave within 30s")
		}
	}
	if got := shardRVs(); !maps.Equal(got, after) {
		t.Fatal("a stamp rewrote shards")
	}
	eventually("node-live alone, whole", func(n map[string]*v1beta1.NodeInventory) bool {
		return len(n) == 1 && n["node-live"] != nil && len(n["node-live"].Spec.Sandboxes) == 299
	})
	if cands, err := src.WarmCandidates(ctx, "base", 100); err != nil || len(cands) != 60 {
		t.Fatalf("WarmCandidates = %d, %v; want node-live's 60", len(cands), err)
	}

	// The host restarts with structured shards (for readers older than
	// spec.packed): its first write rewrites every shard as a list, the
	// packed strings go (server-side apply drops what it no longer
	// sends), and readers join the same sandboxes.
	format = skiffpublish.ShardsStructured
	w = skiffpublish.NewKubeWriter(dyn, skiffpublish.Options{SandboxShards: 4, ShardFormat: format})
	if err := w.Apply(ctx, live); err != nil {
		t.Fatal(err)
	}
	shardRVs() // checks every shard of node-live is now a list
	eventually("node-live whole from structured shards", func(n map[string]*v1beta1.NodeInventory) bool {
		return len(n) == 1 && n["node-live"] != nil && maps.Equal(ids(n["node-live"]), ids(live))
	})

	// The inventory deleted and made again (its shards with it, as the
	// garbage collector would): the next write restores every shard.
	deleteInventory(t, env, "node-live")
	at := metav1.Now()
	live.PublishedAt = &at
	if err := w.Stamp(ctx, live); err == nil {
		t.Fatal("a stamp of a deleted inventory succeeded")
	}
	if err := w.Apply(ctx, live); err != nil {
		t.Fatal(err)
	}
	eventually("node-live restored whole", func(n map[string]*v1beta1.NodeInventory) bool {
		return n["node-live"] != nil && len(n["node-live"].Spec.Sandboxes) == 299
	})
}

// A host that carries its changes in its inventory (publish.Options.
// MaxChanges) writes no shard for a change: the inventory carries it, and
// readers see it applied to the shards. Past the bound, or on a publish
// with nothing newer (a stamp), the host folds: it rewrites the shards
// that differ under a new fold number, and the inventory carries nothing.
// A restarted host writes every shard again before it carries changes.
func TestControlPlaneChangesCarried(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(env.Config)
	opts := skiffpublish.Options{SandboxShards: 4, ShardFormat: skiffpublish.ShardsPacked, MaxChanges: 3}
	reg := prometheus.NewRegistry()
	w := skiffpublish.NewKubeWriter(dyn, opts).WithMetrics(skiffpublish.NewMetrics(reg))
	// metrics are the writer's shard writes, folds and carried changes.
	metrics := func() [3]float64 {
		t.Helper()
		return [3]float64{metric(t, reg, "inventory_shard_writes_total"), metric(t, reg, "inventory_folds_total"), metric(t, reg, "inventory_carried_changes")}
	}
	host := shardedHost("node-c", 40)
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	// stored is the inventory's changes and its shards' folds and
	// resourceVersions, as stored.
	type shardState struct {
		rv   string
		fold int64
	}
	stored := func() (*v1beta1.SandboxChanges, map[string]shardState) {
		t.Helper()
		var inv v1beta1.NodeInventory
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-c"}, &inv); err != nil {
			t.Fatal(err)
		}
		var list v1beta1.NodeInventoryShardList
		if err := env.Client.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		out := map[string]shardState{}
		for _, sh := range list.Items {
			out[sh.Name] = shardState{sh.ResourceVersion, sh.Spec.Fold}
		}
		return inv.Spec.SandboxChanges, out
	}
	// shardsNamed checks that the stored inventory names the newest write
	// of the shards stored (spec.shardsResourceVersion); "" when want is
	// that it names none.
	shardsNamed := func(step, want string) {
		t.Helper()
		var inv v1beta1.NodeInventory
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-c"}, &inv); err != nil {
			t.Fatal(err)
		}
		if want != "" {
			var newest uint64
			_, shards := stored()
			for _, sh := range shards {
				rv, _ := strconv.ParseUint(sh.rv, 10, 64)
				newest = max(newest, rv)
			}
			want = strconv.FormatUint(newest, 10)
		}
		if inv.Spec.ShardsResourceVersion != want {
			t.Errorf("%s: the inventory names shard write %q, want %q", step, inv.Spec.ShardsResourceVersion, want)
		}
	}
	changes, first := stored()
	if changes != nil || len(first) != 4 {
		t.Fatalf("first write: changes %+v, %d shards; want none and 4", changes, len(first))
	}
	// The first inventory was written before its shards, which name it as
	// their owner.
	shardsNamed("first write", "")
	fold0 := first[v1beta1.ShardName("node-c", 0)].fold
	for name, sh := range first {
		if sh.fold == 0 || sh.fold != fold0 {
			t.Fatalf("first write: shard %s of fold %d, want every shard of one fold > 0 (%d)", name, sh.fold, fold0)
		}
	}

	c := env.StartCache(t, &v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{})
	src := kubeinventory.New(c, kubeinventory.NewOptions())
	tracked := trackedSource(t, c, c, kubeinventory.NewOptions())
	// seen waits until the readers' node-c has host's sandboxes, each with
	// its metadata: for a Source that reads every shard and for one that
	// reads only those with events (as the servers' does), by name and in
	// lists.
	seen := func(what string) {
		t.Helper()
		want := map[string]string{}
		for _, e := range host.Spec.Sandboxes {
			want[e.ID] = e.Metadata["i"]
		}
		deadline := time.Now().Add(30 * time.Second)
		for _, src := range []*kubeinventory.Source{src, tracked} {
			for _, list := range []bool{false, true} {
				for {
					inv, err := src.NodeInventory(ctx, "node-c")
					if list {
						var invs []v1beta1.NodeInventory
						if invs, err = src.ListNodesShared(ctx); err == nil && len(invs) == 1 {
							inv = &invs[0]
						}
					}
					got := map[string]string{}
					if err == nil {
						for _, e := range inv.Spec.Sandboxes {
							got[e.ID] = e.Metadata["i"]
						}
					}
					if err == nil && maps.Equal(got, want) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: the reader has %d sandboxes (%v), want %d", what, len(got), err, len(want))
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
	seen("first write")

	// Three changes: one gone, one changed, one new. No shard is written;
	// the inventory carries them on top of the first fold.
	host.Spec.Sandboxes = slices.Delete(host.Spec.Sandboxes, 3, 4)
	host.Spec.Sandboxes[5].Metadata = map[string]string{"i": "changed"}
	extra := shardedHost("node-c", 41).Spec.Sandboxes[40]
	host.Spec.Sandboxes = append(host.Spec.Sandboxes, extra)
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	changes, shards := stored()
	if !maps.Equal(shards, first) {
		t.Fatal("three changes, within the bound, rewrote shards")
	}
	if changes == nil || changes.Fold != fold0 || len(changes.Removed) != 1 || changes.Packed == "" {
		t.Fatalf("stored changes %+v, want 2 entries and 1 removed on top of fold %d", changes, fold0)
	}
	if entries, err := changes.Entries(); err != nil || len(entries) != 2 {
		t.Fatalf("stored changes: %d entries, %v; want 2", len(entries), err)
	}
	seen("three changes carried")
	shardsNamed("three changes carried", "the newest")
	if got := metrics(); got != [3]float64{4, 0, 3} {
		t.Errorf("shard writes, folds, carried changes: %v, want the first write's 4 shards, no fold, 3 carried", got)
	}

	// A fourth change: past the bound, the host folds.
	host.Spec.Sandboxes[6].Metadata = map[string]string{"i": "changed too"}
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	changes, shards = stored()
	if changes != nil {
		t.Fatalf("after a fold the inventory carries %+v", changes)
	}
	fold1 := int64(0)
	for name, sh := range shards {
		if sh != first[name] {
			fold1 = max(fold1, sh.fold)
		}
	}
	if fold1 <= fold0 {
		t.Fatalf("shards after the fold: %v, before: %v; want some rewritten by a later fold", shards, first)
	}
	seen("folded")
	shardsNamed("folded", "the newest")
	if got := metrics(); got[1] != 1 || got[2] != 0 || got[0] <= 4 {
		t.Errorf("shard writes, folds, carried changes: %v, want shards written by one fold, none carried", got)
	}

	// One change carried, then a publish with nothing newer: a stamp,
	// which folds it.
	host.Spec.Sandboxes = slices.Delete(host.Spec.Sandboxes, 0, 1)
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	if changes, _ := stored(); changes == nil || changes.Fold != fold1 || len(changes.Removed) != 1 {
		t.Fatalf("one sandbox gone: stored changes %+v, want it removed on top of fold %d", changes, fold1)
	}
	seen("one change carried")
	at := metav1.Now()
	host.PublishedAt = &at
	if err := w.Stamp(ctx, host); err != nil {
		t.Fatal(err)
	}
	changes, folded := stored()
	if changes != nil || maps.Equal(folded, shards) {
		t.Fatalf("a stamp of an inventory carrying changes: stored changes %+v, shards unchanged %v; want a fold", changes, maps.Equal(folded, shards))
	}
	seen("folded by a stamp")
	if err := w.Stamp(ctx, host); err != nil {
		t.Fatal(err)
	}
	if _, again := stored(); !maps.Equal(again, folded) {
		t.Fatal("a stamp of an inventory carrying nothing rewrote shards")
	}

	// The host restarts while its inventory carries a change: its first
	// write rewrites every shard, under a fold after all of its
	// predecessor's, before the inventory (which then carries nothing),
	// and only then carries changes.
	host.Spec.Sandboxes[4].Metadata = map[string]string{"i": "carried over the restart"}
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	if changes, _ := stored(); changes == nil {
		t.Fatal("a change before the restart was not carried")
	}
	w = skiffpublish.NewKubeWriter(dyn, opts)
	host.Spec.Sandboxes[1].Metadata = map[string]string{"i": "after the restart"}
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	changes, restarted := stored()
	var fold2 int64
	for name, sh := range restarted {
		if sh == folded[name] {
			t.Errorf("shard %s not written by the restarted host's first write", name)
		}
		fold2 = max(fold2, sh.fold)
	}
	if changes != nil || fold2 <= fold1 {
		t.Fatalf("restarted host's first write: changes %+v, fold %d after %d", changes, fold2, fold1)
	}
	// The shards came first: the inventory, which carried changes, was
	// written after every one of them (its resourceVersion is newer).
	var inv v1beta1.NodeInventory
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-c"}, &inv); err != nil {
		t.Fatal(err)
	}
	invRV, _ := strconv.ParseUint(inv.ResourceVersion, 10, 64)
	for name, sh := range restarted {
		if rv, _ := strconv.ParseUint(sh.rv, 10, 64); rv >= invRV {
			t.Errorf("restarted host's first write: shard %s (rv %d) written after the inventory (rv %d)", name, rv, invRV)
		}
	}
	seen("restarted")
	shardsNamed("restarted", "the newest")
	host.Spec.Sandboxes[2].Metadata = map[string]string{"i": "carried again"}
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	if changes, shards := stored(); changes == nil || changes.Fold != fold2 || !maps.Equal(shards, restarted) {
		t.Fatalf("a change after the restart: stored changes %+v (want on top of fold %d), shards rewritten: %v", changes, fold2, !maps.Equal(shards, restarted))
	}
	seen("carried after the restart")

	// The inventory deleted and made again (its shards with it, as the
	// garbage collector would): the next write, of a change the host
	// would carry, restores every shard.
	deleteInventory(t, env, "node-c")
	host.Spec.Sandboxes[3].Metadata = map[string]string{"i": "after the replacement"}
	if err := w.Apply(ctx, host); err != nil {
		t.Fatal(err)
	}
	if _, shards := stored(); len(shards) != 4 {
		t.Fatalf("after the inventory was replaced: %d shards stored, want 4", len(shards))
	}
	seen("restored after the inventory was replaced")
}

// deleteInventory deletes node's inventory and every shard, as deleting
// the inventory and the garbage collector after it would.
func deleteInventory(t *testing.T, env *kubetest.Env, node string) {
	t.Helper()
	inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := env.Client.Delete(t.Context(), inv); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.DeleteAllOf(t.Context(), &v1beta1.NodeInventoryShard{}); err != nil {
		t.Fatal(err)
	}
}

// trackedSource is a Source over reader (c, or a wrapper of it) that reads
// only the shards of nodes with shard events since their last join, told
// of c's shard events as fleetsource tells the servers'.
func trackedSource(t testing.TB, c cache.Cache, reader client.Reader, opts kubeinventory.Options) *kubeinventory.Source {
	t.Helper()
	src := kubeinventory.New(reader, opts)
	src.TrackShardEvents()
	inf, err := c.GetInformer(t.Context(), &v1beta1.NodeInventoryShard{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.AddEventHandler(src.ShardEventHandler(nil)); err != nil {
		t.Fatal(err)
	}
	return src
}

// countingReader counts the shards read from it, one by one or listed.
type countingReader struct {
	client.Reader
	gets, lists atomic.Int64
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*v1beta1.NodeInventoryShard); ok {
		r.gets.Add(1)
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*v1beta1.NodeInventoryShardList); ok {
		r.lists.Add(1)
	}
	return r.Reader.List(ctx, list, opts...)
}

// A Source told of shard events reads, on a list, the shards of the nodes
// with shard events since their last join and no others; a node's changes
// carried in its inventory are joined without reading its shards.
func TestControlPlaneShardEventsTracked(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	w := skiffpublish.NewKubeWriter(dynamic.NewForConfigOrDie(env.Config), skiffpublish.Options{SandboxShards: 4, ShardFormat: skiffpublish.ShardsPacked, MaxChanges: 64})
	hosts := []*v1beta1.NodeInventory{shardedHost("node-a", 100), shardedHost("node-b", 100), shardedHost("node-c", 100)}
	for _, inv := range hosts {
		if err := w.Apply(ctx, inv); err != nil {
			t.Fatal(err)
		}
	}
	c := env.StartCache(t, &v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{})
	reader := &countingReader{Reader: c}
	src := trackedSource(t, c, reader, kubeinventory.NewOptions())
	// list lists the nodes' sandbox IDs and returns them and the shards
	// the list read.
	list := func() (map[string]map[string]bool, int64) {
		t.Helper()
		before := reader.gets.Load()
		invs, err := src.ListNodesShared(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]map[string]bool{}
		for i := range invs {
			got[invs[i].Name] = ids(&invs[i])
		}
		return got, reader.gets.Load() - before
	}
	// until lists until ok holds of the joined nodes and returns the
	// shards the last list read.
	until := func(what string, ok func(map[string]map[string]bool) bool) int64 {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got, n := list(); ok(got) {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
		}
	}
	whole := func(got map[string]map[string]bool) bool {
		for _, h := range hosts {
			if !maps.Equal(got[h.Name], ids(h)) {
				return false
			}
		}
		return true
	}
	// settled waits until a list reads no shard: once the shard events
	// it waits for have all arrived (the informer delivers them after
	// its cache has the shards), a tracked Source reads nothing more.
	settled := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); until(what, whole) != 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: every list reads shards, with no shard event since the last", what)
			}
		}
	}
	settled("every host joined")

	// A change carried in node-b's inventory: no shard is written, and
	// none is read.
	hosts[1].Spec.Sandboxes = slices.Delete(hosts[1].Spec.Sandboxes, 3, 4)
	if err := w.Apply(ctx, hosts[1]); err != nil {
		t.Fatal(err)
	}
	if n := until("node-b's change carried", whole); n != 0 {
		t.Errorf("joining a change carried in the inventory read %d shards, want 0", n)
	}

	// node-c's shards rewritten (a fold: more changes than MaxChanges):
	// its shards are read, and only its.
	hosts[2].Spec.Sandboxes = hosts[2].Spec.Sandboxes[:10]
	if err := w.Apply(ctx, hosts[2]); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, n := list()
		if whole(got) {
			break
		}
		if n != 0 && n != 4 {
			t.Errorf("a list after node-c's fold read %d shards, want node-c's 4 (or none before the events)", n)
		}
		if time.Now().After(deadline) {
			t.Fatal("node-c's fold: not within 30s")
		}
	}
	settled("after the fold")
	if reader.lists.Load() != 0 {
		t.Errorf("the tracked Source listed every shard %d times", reader.lists.Load())
	}
}

// quoted is metadata at its bound (8 entries, 192 characters) of quotes,
// with v in each value: a quote takes 2 bytes in the packed JSON, and 4
// in the stored object, which escapes the escape again.
func quoted(v string) map[string]string {
	out := map[string]string{}
	for i := range 8 {
		out[fmt.Sprintf(`"%d`, i)] = v + strings.Repeat(`"`, 22-len(v))
	}
	return out
}

// A host whose sandboxes would not fit in the shards it was told to keep
// (--publish-sandbox-shards 1: 1,800 sandboxes whose metadata is all
// quotes) writes them into more shards, which readers join. In one shard
// their packed text would be under the CRD's 1 MiB but 1.7 MB as the
// stored object holds it, which etcd refuses (1.5 MiB): the host would stop
// publishing. Changes too large for the inventory (every sandbox's
// metadata, under --publish-max-changes 4096) are folded into the shards.
func TestControlPlaneShardsGrowPastTheirBound(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(env.Config)
	reg := prometheus.NewRegistry()
	w := skiffpublish.NewKubeWriter(dyn, skiffpublish.Options{SandboxShards: 1, ShardFormat: skiffpublish.ShardsPacked, MaxChanges: v1beta1.MaxShardEntries}).
		WithMetrics(skiffpublish.NewMetrics(reg))
	host := shardedHost("node-big", 1800)
	// meta gives every sandbox metadata v and checks that their text is
	// what the test is about: under 1 MiB packed, over etcd's limit stored.
	meta := func(v string) {
		t.Helper()
		for i := range host.Spec.Sandboxes {
			host.Spec.Sandboxes[i].Metadata = quoted(v)
		}
		packed, err := v1beta1.PackSandboxes(host.Spec.Sandboxes)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := json.Marshal(packed)
		if err != nil {
			t.Fatal(err)
		}
		if len(packed) > v1beta1.MaxPackedBytes || len(stored) <= 3<<19 {
			t.Fatalf("the sandboxes take %d bytes packed and %d stored, want at most %d and over %d", len(packed), len(stored), v1beta1.MaxPackedBytes, 3<<19)
		}
	}
	meta("a")
	if err := w.Apply(ctx, host); err != nil {
		t.Fatalf("apply 1,800 sandboxes whose metadata is quotes, told 1 shard: %v", err)
	}
	c := env.StartCache(t, &v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{})
	src := kubeinventory.New(c, kubeinventory.NewOptions())
	// joined waits until readers see every sandbox of the host with
	// metadata value v, and returns the shards it is stored in.
	joined := func(v string) int32 {
		t.Helper()
		want := quoted(v)
		deadline := time.Now().Add(30 * time.Second)
		for {
			inv, err := src.NodeInventory(ctx, "node-big")
			if err == nil && maps.Equal(ids(inv), ids(host)) && !slices.ContainsFunc(inv.Spec.Sandboxes, func(e v1beta1.SandboxEntry) bool {
				return !maps.Equal(e.Metadata, want)
			}) {
				return inv.Spec.SandboxShards
			}
			if time.Now().After(deadline) {
				t.Fatalf("readers did not see the host's 1,800 sandboxes with metadata %q within 30s (last: %v)", v, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	n := joined("a")
	if n < 2 {
		t.Fatalf("the host's sandboxes are in %d shards, want more than the 1 they cannot fit", n)
	}
	if got := metric(t, reg, "inventory_shards"); got != float64(n) {
		t.Errorf("skiff_vk_sandbox_inventory_shards = %v, want %d", got, n)
	}

	// Every sandbox changes: 1,800 changes, under --publish-max-changes,
	// too large for the inventory.
	meta("b")
	if err := w.Apply(ctx, host); err != nil {
		t.Fatalf("apply a change of every sandbox: %v", err)
	}
	if again := joined("b"); again != n {
		t.Errorf("after the change the sandboxes are in %d shards, want the %d they grew to", again, n)
	}
	var inv v1beta1.NodeInventory
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-big"}, &inv); err != nil {
		t.Fatal(err)
	}
	if !inv.Spec.SandboxChanges.Empty() {
		t.Errorf("the inventory carries %d bytes of changes, want them folded into the shards", len(inv.Spec.SandboxChanges.Packed))
	}
	// And it still stamps.
	stamp := metav1.NewTime(time.Now().Add(time.Second))
	host.PublishedAt = &stamp
	if err := w.Stamp(ctx, host); err != nil {
		t.Fatalf("stamp: %v", err)
	}
}
