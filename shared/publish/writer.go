package publish

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// KubeWriter applies NodeInventories by server-side apply, as field
// manager vk-sandbox with force: the host's publisher owns every field it
// sends, and a field it stops sending (a sandbox that went) is removed.
type KubeWriter struct {
	res dynamic.NamespaceableResourceInterface
}

// NewKubeWriter returns a writer over client.
func NewKubeWriter(client dynamic.Interface) *KubeWriter {
	return &KubeWriter{res: client.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource))}
}

// Apply server-side-applies inv.
func (w *KubeWriter) Apply(ctx context.Context, inv *v1beta1.NodeInventory) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(inv)
	if err != nil {
		return fmt.Errorf("convert NodeInventory %s: %w", inv.Name, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(v1beta1.GroupVersion.String())
	u.SetKind("NodeInventory")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if _, err := w.res.Apply(ctx, inv.Name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("apply NodeInventory %s: %w", inv.Name, err)
	}
	return nil
}
