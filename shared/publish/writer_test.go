package publish

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// After a write of the inventory that the kube-apiserver refused for the
// changes it carried, the next one folds them into the shards rather than
// carrying them again, which would be refused the same way at every
// publish. The changes here carry the removal of an entry whose ID the
// schema refuses in spec.sandboxChanges.removed, though it checks no packed
// entry of a shard.
func TestAFailedCarryIsFoldedNext(t *testing.T) {
	env := kubetest.Start(t)
	w := NewKubeWriter(dynamic.NewForConfigOrDie(env.Config), Options{SandboxShards: 1, ShardFormat: ShardsPacked, MaxChanges: 8})
	stamp := metav1.NewTime(time.Now())
	entry := func(id string) v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{ID: id, Template: "base", State: v1beta1.SandboxRunning, Team: "team-a", StartedAt: v1beta1.NewMicroTime(stamp.Time)}
	}
	inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, PublishedAt: &stamp,
		Spec: v1beta1.NodeInventorySpec{Endpoint: "127.0.0.1:27777", Sandboxes: []v1beta1.SandboxEntry{entry("abcdefghij0123456789"), entry("NOT-AN-ID")}}}
	if err := w.Apply(t.Context(), inv); err != nil {
		t.Fatal(err)
	}
	inv.Spec.Sandboxes = inv.Spec.Sandboxes[:1]
	if err := w.Apply(t.Context(), inv); err == nil {
		t.Fatal("the kube-apiserver took the removal of an ID its schema refuses: the test shows nothing")
	}
	if err := w.Apply(t.Context(), inv); err != nil {
		t.Fatalf("the publish after the refused one: %v, want it folded and written", err)
	}
	stored := get(t, dynamic.NewForConfigOrDie(env.Config), "node-a")
	if !stored.Spec.SandboxChanges.Empty() {
		t.Errorf("the inventory carries changes %+v, want them folded", stored.Spec.SandboxChanges)
	}
}

// A host restarted with fewer shards than its stored inventory named
// empties the shards past its count once its inventory names the new one;
// those within it hold every sandbox.
func TestLeftoverShardsEmptied(t *testing.T) {
	env := kubetest.Start(t)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	stamp := metav1.NewTime(time.Now())
	inv := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, PublishedAt: &stamp,
		Spec: v1beta1.NodeInventorySpec{Endpoint: "127.0.0.1:27777"}}
	for i := range 100 {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{ID: fmt.Sprintf("%020d", i), Template: "base",
			State: v1beta1.SandboxRunning, Team: "team-a", StartedAt: v1beta1.NewMicroTime(stamp.Time)})
	}
	opts := Options{SandboxShards: 4, ShardFormat: ShardsPacked, MaxChanges: 8}
	if err := NewKubeWriter(dyn, opts).Apply(t.Context(), inv); err != nil {
		t.Fatal(err)
	}
	opts.SandboxShards = 2
	if err := NewKubeWriter(dyn, opts).Apply(t.Context(), inv); err != nil {
		t.Fatal(err)
	}
	if got := get(t, dyn, "node-a").Spec.SandboxShards; got != 2 {
		t.Fatalf("the inventory names %d shards, want 2", got)
	}
	held := 0
	for k := range 4 {
		u, err := dyn.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryShardResource)).Get(t.Context(), v1beta1.ShardName("node-a", k), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var sh v1beta1.NodeInventoryShard
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &sh); err != nil {
			t.Fatal(err)
		}
		entries, err := sh.Spec.UnpackedSandboxes()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case k >= 2 && len(entries)+len(sh.Spec.Sandboxes) > 0:
			t.Errorf("shard %d, past the 2 the host keeps now, holds %d sandboxes, want none", k, len(entries)+len(sh.Spec.Sandboxes))
		case k < 2:
			held += len(entries)
		}
	}
	if held != 100 {
		t.Errorf("the 2 shards hold %d sandboxes, want 100", held)
	}
}
