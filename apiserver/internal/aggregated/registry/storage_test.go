package registry

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/view"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func id(node string, n int) string {
	tag := string(sandboxid.NodeTag(node))
	return fmt.Sprintf("%0*d", sandboxid.Len-len(tag), n) + tag
}

func inv(name string, rv int, teams ...string) *v1beta1.NodeInventory {
	n := &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: strconv.Itoa(rv)}}
	for i, team := range teams {
		n.Spec.Sandboxes = append(n.Spec.Sandboxes, v1beta1.SandboxEntry{ID: id(name, i), Template: "base", State: v1beta1.SandboxRunning,
			Team: team, StartedAt: v1beta1.NewMicroTime(time.Now().Add(-time.Hour)), Metadata: map[string]string{"i": strconv.Itoa(i % 2)}})
	}
	return n
}

type recorder struct{ killed []string }

func (r *recorder) Kill(_ context.Context, sb *sbv1.Sandbox) error {
	r.killed = append(r.killed, sb.Namespace+"/"+sb.Name)
	return nil
}

func newStorage(t testing.TB, src *inventory.StaticSource) (*Storage, *view.View, *recorder) {
	t.Helper()
	v := view.New(src, view.Options{Snapshots: 2})
	if err := v.Rebuild(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	return New(v, r, time.Minute), v, r
}

func list(t *testing.T, s *Storage, ns string, o *metainternalversion.ListOptions) *sbv1.SandboxList {
	t.Helper()
	out, err := s.List(genericapirequest.WithNamespace(t.Context(), ns), o)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*sbv1.SandboxList)
}

func TestListPagesFromOneSnapshot(t *testing.T) {
	src := inventory.NewStaticSource(inv("n1", 10, "a", "a", "b", "a", "b"))
	s, v, _ := newStorage(t, src)
	first := list(t, s, "", &metainternalversion.ListOptions{Limit: 2})
	if len(first.Items) != 2 || first.Continue == "" || *first.RemainingItemCount != 3 {
		t.Fatalf("first page: %d items, continue %q", len(first.Items), first.Continue)
	}
	// The fleet changes between pages; the pages still come from the
	// first one's snapshot.
	src.Apply(inv("n1", 11, "a"))
	if err := v.Rebuild(t.Context()); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sb := range first.Items {
		names = append(names, sb.Namespace+"/"+sb.Name)
	}
	cont := first.Continue
	for cont != "" {
		page := list(t, s, "", &metainternalversion.ListOptions{Limit: 2, Continue: cont})
		for _, sb := range page.Items {
			names = append(names, sb.Namespace+"/"+sb.Name)
		}
		if page.ResourceVersion != first.ResourceVersion {
			t.Errorf("page rv %s, first %s", page.ResourceVersion, first.ResourceVersion)
		}
		cont = page.Continue
	}
	if len(names) != 5 || names[0] >= names[1] || names[3] >= names[4] {
		t.Errorf("pages gave %v", names)
	}
	// Namespaced: a's three, paged.
	if l := list(t, s, "a", nil); len(l.Items) != 1 {
		t.Errorf("a now has %d", len(l.Items))
	}
	// Two more batches and the first snapshot is gone: 410.
	src.Apply(inv("n1", 12))
	_ = v.Rebuild(t.Context())
	if _, err := s.List(t.Context(), &metainternalversion.ListOptions{Limit: 2, Continue: first.Continue}); !apierrors.IsResourceExpired(err) {
		t.Errorf("an expired continue: %v, want 410", err)
	}
	if _, err := s.List(t.Context(), &metainternalversion.ListOptions{Continue: "garbage"}); !apierrors.IsBadRequest(err) {
		t.Errorf("a garbage continue: %v, want 400", err)
	}
}

func TestSelectors(t *testing.T) {
	s, _, _ := newStorage(t, inventory.NewStaticSource(inv("n1", 10, "a", "a", "a"), inv("n2", 11, "a")))
	o := &metainternalversion.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{"i": "1"})}
	if l := list(t, s, "a", o); len(l.Items) != 1 || l.Items[0].Name != id("n1", 1) {
		t.Errorf("label selector: %v", l.Items)
	}
	o = &metainternalversion.ListOptions{FieldSelector: fields.OneTermEqualSelector(sbv1.FieldNodeName, "n2")}
	if l := list(t, s, "", o); len(l.Items) != 1 || l.Items[0].Spec.NodeName != "n2" {
		t.Errorf("field selector: %v", l.Items)
	}
	o = &metainternalversion.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.cpu", "1")}
	if _, err := s.List(t.Context(), o); !apierrors.IsBadRequest(err) {
		t.Errorf("unknown field: %v", err)
	}
}

func TestDeleteAndTable(t *testing.T) {
	s, _, r := newStorage(t, inventory.NewStaticSource(inv("n1", 10, "a", "b")))
	ctx := genericapirequest.WithNamespace(t.Context(), "a")
	if _, _, err := s.Delete(ctx, id("n1", 1), nil, nil); !apierrors.IsNotFound(err) {
		t.Errorf("delete of b's sandbox in a: %v", err)
	}
	obj, done, err := s.Delete(ctx, id("n1", 0), nil, &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil || !done || obj == nil || len(r.killed) != 0 {
		t.Fatalf("dry run: %v %v, killed %v", err, done, r.killed)
	}
	if _, _, err := s.Delete(ctx, id("n1", 0), nil, nil); err != nil || len(r.killed) != 1 || r.killed[0] != "a/"+id("n1", 0) {
		t.Fatalf("delete: %v, killed %v", err, r.killed)
	}
	l := list(t, s, "", nil)
	tab, err := s.ConvertToTable(t.Context(), l, nil)
	if err != nil || len(tab.Rows) != 2 || tab.ColumnDefinitions[5].Name != "Ends" || tab.Rows[0].Cells[4] != "60m" || tab.Rows[0].Cells[5] != "<none>" {
		t.Errorf("table: %v %+v", err, tab)
	}
}
