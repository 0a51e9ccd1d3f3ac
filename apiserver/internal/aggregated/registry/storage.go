// Package registry is the REST storage of sandbox.skiff.dev/v1beta1
// sandboxes: get, list, watch and delete, answered from the view of the
// fleet (package view), with kubectl's table.
package registry

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/view"
)

// Killer kills a sandbox on its host.
type Killer interface {
	// Kill kills sb (as the view last showed it). An error for which
	// apierrors.IsNotFound is true means its host no longer has it.
	Kill(ctx context.Context, sb *v1beta1.Sandbox) error
}

// Storage serves sandboxes from a view.
type Storage struct {
	view   *view.View
	killer Killer
	// bookmarkInterval is how often a watch that allows bookmarks gets one.
	bookmarkInterval time.Duration
	now              func() time.Time
}

var (
	_ rest.Storage              = (*Storage)(nil)
	_ rest.Scoper               = (*Storage)(nil)
	_ rest.Getter               = (*Storage)(nil)
	_ rest.Lister               = (*Storage)(nil)
	_ rest.Watcher              = (*Storage)(nil)
	_ rest.GracefulDeleter      = (*Storage)(nil)
	_ rest.SingularNameProvider = (*Storage)(nil)
	_ rest.ShortNamesProvider   = (*Storage)(nil)
	_ rest.CategoriesProvider   = (*Storage)(nil)
)

// New returns the storage of sandboxes over v; kills go to k.
func New(v *view.View, k Killer, bookmarkInterval time.Duration) *Storage {
	return &Storage{view: v, killer: k, bookmarkInterval: bookmarkInterval, now: time.Now}
}

var resource = v1beta1.Resource("sandboxes")

// New returns an empty Sandbox.
func (s *Storage) New() runtime.Object { return &v1beta1.Sandbox{} }

// NewList returns an empty SandboxList.
func (s *Storage) NewList() runtime.Object { return &v1beta1.SandboxList{} }

// Destroy has nothing to release: the view belongs to the caller.
func (s *Storage) Destroy() {}

// NamespaceScoped is true: a sandbox is in its team's namespace.
func (s *Storage) NamespaceScoped() bool { return true }

// GetSingularName is "sandbox".
func (s *Storage) GetSingularName() string { return "sandbox" }

// ShortNames are kubectl's short names.
func (s *Storage) ShortNames() []string { return []string{"sbx"} }

// Categories puts sandboxes in `kubectl get skiff`, beside the CRDs.
func (s *Storage) Categories() []string { return []string{"skiff"} }

// Get returns one sandbox of the request's namespace.
func (s *Storage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	snap, err := s.view.WaitFor(ctx, 0)
	if err != nil {
		return nil, err
	}
	ns := genericapirequest.NamespaceValue(ctx)
	sb := snap.Get(ns, name)
	if sb == nil {
		return nil, apierrors.NewNotFound(resource, name)
	}
	return sb.DeepCopy(), nil
}

// continueToken is what a list's continue string carries: the snapshot the
// first page came from and the last key it returned.
type continueToken struct {
	// V versions the token's shape.
	V         int    `json:"v"`
	RV        uint64 `json:"rv"`
	Namespace string `json:"ns,omitempty"`
	Name      string `json:"name"`
}

func encodeContinue(t continueToken) string {
	t.V = 1
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeContinue(s string) (continueToken, error) {
	var t continueToken
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err == nil && t.V != 1 {
		err = fmt.Errorf("version %d", t.V)
	}
	if err != nil || t.Name == "" {
		return t, apierrors.NewBadRequest("continue: not a continue token this server issued")
	}
	return t, nil
}

// parseRV parses a resourceVersion parameter; "" is 0.
func parseRV(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	rv, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion %q: not a resource version this server issued", s))
	}
	return rv, nil
}

// List returns the request namespace's sandboxes (all of them for a list
// across namespaces) that match the selectors, a page at a time when a
// limit is set. Pages after the first come from the first page's
// snapshot, so a paged list is consistent; once that snapshot is no longer
// kept, the continue token is 410 Gone, as etcd's compaction makes it.
func (s *Storage) List(ctx context.Context, o *metainternalversion.ListOptions) (runtime.Object, error) {
	if o == nil {
		o = &metainternalversion.ListOptions{}
	}
	filter, err := selector(o)
	if err != nil {
		return nil, err
	}
	snap, start, err := s.listSnapshot(ctx, o)
	if err != nil {
		return nil, err
	}
	ns := genericapirequest.NamespaceValue(ctx)
	if ns != "" && start == 0 {
		start = snap.From(ns)
	}
	items := snap.Items()
	out := &v1beta1.SandboxList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatUint(snap.RV, 10)}}
	for i := start; i < len(items); i++ {
		sb := items[i]
		if ns != "" && sb.Namespace != ns {
			break
		}
		if !filter(sb) {
			continue
		}
		if o.Limit > 0 && int64(len(out.Items)) == o.Limit {
			last := out.Items[len(out.Items)-1]
			out.Continue = encodeContinue(continueToken{RV: snap.RV, Namespace: last.Namespace, Name: last.Name})
			remaining := int64(0)
			for _, rest := range items[i:] {
				if ns != "" && rest.Namespace != ns {
					break
				}
				if filter(rest) {
					remaining++
				}
			}
			out.RemainingItemCount = &remaining
			break
		}
		out.Items = append(out.Items, *sb)
	}
	if out.Items == nil {
		out.Items = []v1beta1.Sandbox{}
	}
	return out, nil
}

// listSnapshot picks the snapshot a list answers from, and the index to
// start at, by its continue token or resourceVersion semantics.
func (s *Storage) listSnapshot(ctx context.Context, o *metainternalversion.ListOptions) (*view.Snapshot, int, error) {
	if o.Continue != "" {
		t, err := decodeContinue(o.Continue)
		if err != nil {
			return nil, 0, err
		}
		snap, err := s.view.At(t.RV)
		if err != nil {
			return nil, 0, err
		}
		return snap, snap.After(t.Namespace, t.Name), nil
	}
	rv, err := parseRV(o.ResourceVersion)
	if err != nil {
		return nil, 0, err
	}
	if o.ResourceVersionMatch == metav1.ResourceVersionMatchExact {
		snap, err := s.view.At(rv)
		return snap, 0, err
	}
	// "", "0" and NotOlderThan: the newest snapshot, once it has reached rv.
	snap, err := s.view.WaitFor(ctx, rv)
	return snap, 0, err
}

// selector returns the filter of the list's label and field selectors.
func selector(o *metainternalversion.ListOptions) (func(*v1beta1.Sandbox) bool, error) {
	lsel, fsel := o.LabelSelector, o.FieldSelector
	if lsel == nil {
		lsel = labels.Everything()
	}
	if fsel == nil {
		fsel = fields.Everything()
	}
	for _, r := range fsel.Requirements() {
		if _, ok := fieldLabels[r.Field]; !ok {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %q: field %q is not supported: use one of metadata.name, metadata.namespace, %s, %s, %s",
				fsel.String(), r.Field, v1beta1.FieldNodeName, v1beta1.FieldState, v1beta1.FieldTemplate))
		}
	}
	if lsel.Empty() && fsel.Empty() {
		return func(*v1beta1.Sandbox) bool { return true }, nil
	}
	return func(sb *v1beta1.Sandbox) bool {
		return lsel.Matches(labels.Set(sb.Labels)) && fsel.Matches(Fields(sb))
	}, nil
}

// fieldLabels are the fields a selector may use.
var fieldLabels = map[string]struct{}{
	"metadata.name": {}, "metadata.namespace": {},
	v1beta1.FieldNodeName: {}, v1beta1.FieldState: {}, v1beta1.FieldTemplate: {},
}

// Fields returns the selectable fields of sb.
func Fields(sb *v1beta1.Sandbox) fields.Set {
	return fields.Set{
		"metadata.name":       sb.Name,
		"metadata.namespace":  sb.Namespace,
		v1beta1.FieldNodeName: sb.Spec.NodeName,
		v1beta1.FieldState:    string(sb.Status.State),
		v1beta1.FieldTemplate: sb.Spec.Template,
	}
}

// FieldLabelConversion accepts the selectable fields (the scheme's field
// label conversion function for Sandbox).
func FieldLabelConversion(label, value string) (string, string, error) {
	if _, ok := fieldLabels[label]; ok {
		return label, value, nil
	}
	return "", "", fmt.Errorf("field label not supported: %s", label)
}

// Watch watches the request namespace's sandboxes (all of them across
// namespaces) that match the selectors.
func (s *Storage) Watch(ctx context.Context, o *metainternalversion.ListOptions) (watch.Interface, error) {
	if o == nil {
		o = &metainternalversion.ListOptions{}
	}
	filter, err := selector(o)
	if err != nil {
		return nil, err
	}
	rv, err := parseRV(o.ResourceVersion)
	if err != nil {
		return nil, err
	}
	ns := genericapirequest.NamespaceValue(ctx)
	wo := view.WatchOptions{
		ResourceVersion:   rv,
		SendInitialEvents: o.SendInitialEvents != nil && *o.SendInitialEvents,
		Bookmarks:         o.AllowWatchBookmarks,
		BookmarkInterval:  s.bookmarkInterval,
		Filter:            filter,
	}
	if ns != "" {
		wo.Filter = func(sb *v1beta1.Sandbox) bool { return sb.Namespace == ns && filter(sb) }
	}
	if o.SendInitialEvents != nil && !*o.SendInitialEvents && rv == 0 {
		// No opening burst: from the newest snapshot on.
		snap, err := s.view.WaitFor(ctx, 0)
		if err != nil {
			return nil, err
		}
		wo.ResourceVersion = snap.RV
	}
	return s.view.Watch(ctx, wo)
}

// Delete kills a sandbox on its host. A sandbox the view does not show
// (unknown, or on a node whose inventory is stale) is 404.
func (s *Storage) Delete(ctx context.Context, name string, validate rest.ValidateObjectFunc, o *metav1.DeleteOptions) (runtime.Object, bool, error) {
	snap, err := s.view.WaitFor(ctx, 0)
	if err != nil {
		return nil, false, err
	}
	ns := genericapirequest.NamespaceValue(ctx)
	sb := snap.Get(ns, name)
	if sb == nil {
		return nil, false, apierrors.NewNotFound(resource, name)
	}
	if o != nil && o.Preconditions != nil {
		if uid := o.Preconditions.UID; uid != nil && *uid != sb.UID {
			return nil, false, apierrors.NewConflict(resource, name, fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *uid, sb.UID))
		}
		if rv := o.Preconditions.ResourceVersion; rv != nil && *rv != sb.ResourceVersion {
			return nil, false, apierrors.NewConflict(resource, name, fmt.Errorf("precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *rv, sb.ResourceVersion))
		}
	}
	out := sb.DeepCopy()
	if validate != nil {
		if err := validate(ctx, out); err != nil {
			return nil, false, err
		}
	}
	if o != nil && len(o.DryRun) > 0 {
		return out, true, nil
	}
	if err := s.killer.Kill(ctx, out); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, apierrors.NewNotFound(resource, name)
		}
		var st apierrors.APIStatus
		if errors.As(err, &st) {
			return nil, false, err
		}
		return nil, false, apierrors.NewInternalError(fmt.Errorf("kill sandbox %s on node %s: %w", name, out.Spec.NodeName, err))
	}
	return out, true, nil
}

// ConvertToTable is kubectl's table: NAME, TEMPLATE, STATE, NODE, AGE, ENDS
// (and, with -o wide, POOL, CPU and MEMORY).
func (s *Storage) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	t := &metav1.Table{ColumnDefinitions: columns}
	now := s.now()
	add := func(sb *v1beta1.Sandbox) {
		ends := "<none>"
		if sb.Spec.EndAt != nil {
			ends = until(now, sb.Spec.EndAt.Time)
		}
		pool := sb.Spec.Pool
		if pool == "" {
			pool = "<none>"
		}
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells: []any{sb.Name, sb.Spec.Template, string(sb.Status.State), sb.Spec.NodeName,
				age(now, sb.CreationTimestamp.Time), ends, pool, sb.Spec.Resources.CPUMilli, sb.Spec.Resources.MemoryMiB},
			Object: runtime.RawExtension{Object: sb},
		})
	}
	switch o := obj.(type) {
	case *v1beta1.Sandbox:
		add(o)
		t.ResourceVersion = o.ResourceVersion
	case *v1beta1.SandboxList:
		for i := range o.Items {
			add(&o.Items[i])
		}
		t.ResourceVersion, t.Continue, t.RemainingItemCount = o.ResourceVersion, o.Continue, o.RemainingItemCount
	default:
		if m, err := meta.ListAccessor(obj); err == nil {
			t.ResourceVersion = m.GetResourceVersion()
		}
	}
	return t, nil
}

var columns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "The sandbox ID (e2b's sandboxID)."},
	{Name: "Template", Type: "string", Description: "The SandboxTemplate it was started from."},
	{Name: "State", Type: "string", Description: "running, paused or warm."},
	{Name: "Node", Type: "string", Description: "The host it runs on."},
	{Name: "Age", Type: "string", Description: "Since it started (or was claimed)."},
	{Name: "Ends", Type: "string", Description: "Until its deadline, when its host kills or pauses it."},
	{Name: "Pool", Type: "string", Priority: 1, Description: "The SandboxWarmPool that started it."},
	{Name: "CPU", Type: "integer", Priority: 1, Description: "CPU, in thousandths of a core."},
	{Name: "Memory", Type: "integer", Priority: 1, Description: "Memory, in MiB."},
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

func until(now, t time.Time) string {
	if d := t.Sub(now); d > 0 {
		return duration.HumanDuration(d)
	}
	return "now"
}
