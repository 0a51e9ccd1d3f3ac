package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

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
type KubeWriter struct {
	res dynamic.NamespaceableResourceInterface

	mu      sync.Mutex
	written map[string]string // inventory name → resourceVersion of the last write
}

// NewKubeWriter returns a writer over client.
func NewKubeWriter(client dynamic.Interface) *KubeWriter {
	return &KubeWriter{res: client.Resource(v1beta1.GroupVersion.WithResource(v1beta1.NodeInventoryResource)), written: map[string]string{}}
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
	out, err := w.res.Apply(ctx, inv.Name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	w.remember(inv.Name, out, err)
	if err != nil {
		return fmt.Errorf("apply NodeInventory %s: %w", inv.Name, err)
	}
	return nil
}

// Stamp implements Stamper: the stored object's resourceVersion is the
// patch's precondition, so a change by anyone else since the last write
// fails it (409) rather than being stamped as fresh.
func (w *KubeWriter) Stamp(ctx context.Context, inv *v1beta1.NodeInventory) error {
	w.mu.Lock()
	rv := w.written[inv.Name]
	w.mu.Unlock()
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
		return fmt.Errorf("stamp NodeInventory %s: %w (%w)", inv.Name, ErrStale, err)
	case err != nil:
		return fmt.Errorf("stamp NodeInventory %s: %w", inv.Name, err)
	}
	return nil
}

// remember keeps the resourceVersion a write left, or forgets it after a
// failed one (its outcome is unknown).
func (w *KubeWriter) remember(name string, out *unstructured.Unstructured, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil || out == nil {
		delete(w.written, name)
		return
	}
	w.written[name] = out.GetResourceVersion()
}
