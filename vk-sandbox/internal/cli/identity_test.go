package cli

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// A host's own identity, as production gives it (a kubeconfig holding a
// client certificate with CN skiff:node:<node> and O skiff:nodes), is
// enough to publish the host's NodeInventory through the kubeconfig serve
// loads, and is refused another host's: what the shipped RBAC and policy
// (api/policies) grant it, on a real kube-apiserver.
func TestPublishesWithTheHostsOwnIdentity(t *testing.T) {
	env := kubetest.Start(t)
	cfg, err := kubeclient.RESTConfig(kubetest.WriteKubeconfig(t, env.NodeUser(t, "host-a").Config), "vk-sandbox/host-a")
	if err != nil {
		t.Fatal(err)
	}
	w := publish.NewKubeWriter(dynamic.NewForConfigOrDie(cfg), publish.NewOptions())
	inv := func(name string) *v1beta1.NodeInventory {
		return &v1beta1.NodeInventory{
			ObjectMeta:  metav1.ObjectMeta{Name: name},
			PublishedAt: &metav1.Time{Time: time.Now()},
			Spec: v1beta1.NodeInventorySpec{
				Endpoint: "10.0.0.1:27777",
				Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 4},
			},
		}
	}
	for range 2 { // the first publish creates, the next patches
		if err := w.Apply(t.Context(), inv("host-a")); err != nil {
			t.Fatalf("publish its own inventory: %v", err)
		}
	}
	err = w.Apply(t.Context(), inv("host-b"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "skiff:node:host-a may not create NodeInventory host-b") {
		t.Fatalf("publish host-b's inventory as host-a: %v, want Forbidden by the policy", err)
	}
}
