package publish

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// After two writes of the inventory in a row that the kube-apiserver
// refused while they carried changes, the next one folds them into the
// shards rather than carrying them again, which would be refused the same
// way at every publish; after one, it carries them again (a passing
// failure is not answered by a write of every shard). The changes here
// carry the removal of an entry whose ID the schema refuses in
// spec.sandboxChanges.removed, though it checks no packed entry of a
// shard.
func TestARefusedCarryIsFolded(t *testing.T) {
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
	for i := range 2 {
		if err := w.Apply(t.Context(), inv); err == nil {
			t.Fatalf("write %d: the kube-apiserver took the removal of an ID its schema refuses (carried again after one refusal?)", i+1)
		}
	}
	if err := w.Apply(t.Context(), inv); err != nil {
		t.Fatalf("the publish after two refused ones: %v, want it folded and written", err)
	}
	stored := get(t, dynamic.NewForConfigOrDie(env.Config), "node-a")
	if !stored.Spec.SandboxChanges.Empty() {
		t.Errorf("the inventory carries changes %+v, want them folded", stored.Spec.SandboxChanges)
	}
}
