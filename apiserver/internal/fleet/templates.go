package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// Catalog is where the fleet's templates come from: the templates a team
// may list, and what a templateID (a name or an alias) resolves to.
//
// Resources a template leaves at zero are filled in by the Backend from
// its Defaults.
type Catalog interface {
	// Templates returns every template, in any order.
	Templates(ctx context.Context) ([]e2bapi.Template, error)
	// Template resolves a template name or alias; an error wrapping
	// e2bapi.ErrNotFound if nothing answers to name.
	Template(ctx context.Context, name string) (*e2bapi.Template, error)
}

// Templates returns the catalog's templates, ordered by ID. Every team may
// start every template.
func (b *Backend) Templates(ctx context.Context, _ string) ([]e2bapi.Template, error) {
	ts, err := b.catalog.Templates(ctx)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	for i := range ts {
		b.fillDefaults(&ts[i])
	}
	slices.SortFunc(ts, func(a, b e2bapi.Template) int { return strings.Compare(a.ID, b.ID) })
	return ts, nil
}

// Template resolves a template name or alias through the catalog, and
// else one of the team's snapshots.
func (b *Backend) Template(ctx context.Context, team string, name string) (*e2bapi.Template, error) {
	// As e2b's id.ParseName: a template's name of any case, and the
	// default tag no tag ("Base:default" is "base"). A snapshot's tag
	// keeps its case.
	t, err := b.catalog.Template(ctx, strings.ToLower(trimDefaultTag(name)))
	if errors.Is(err, e2bapi.ErrNotFound) && team != "" {
		if ref, ok := e2bapi.ParseSnapshotRef(team, name); ok {
			s, serr := b.findSnapshot(ctx, team, ref)
			if serr != nil {
				if errors.Is(serr, e2bapi.ErrNotFound) {
					return nil, err
				}
				return nil, serr
			}
			return &e2bapi.Template{ID: s.ID, Aliases: s.Names(), Version: s.ID, CreatedAt: s.CreatedAt, UpdatedAt: s.CreatedAt, Snapshot: s}, nil
		}
	}
	if err != nil {
		return nil, err
	}
	b.fillDefaults(t)
	return t, nil
}

// resources returns what a cold create of template gives the sandbox: the
// template's own resources, each falling back to the Backend's default. A
// template that vanished since the caller resolved it gets the defaults:
// placement then answers for it, as for a template no fresh node holds.
func (b *Backend) resources(ctx context.Context, template string) (Defaults, error) {
	t, err := b.Template(ctx, "", template)
	switch {
	case errors.Is(err, e2bapi.ErrNotFound):
		return b.defaults, nil
	case err != nil:
		return Defaults{}, fmt.Errorf("resources of template %s: %w", template, err)
	}
	return Defaults{CPUMilli: t.CPUMilli, MemoryMiB: t.MemoryMB, DiskMiB: t.DiskMB}, nil
}

func (b *Backend) fillDefaults(t *e2bapi.Template) {
	if t.Aliases == nil {
		t.Aliases = []string{}
	}
	if t.CPUMilli <= 0 {
		t.CPUMilli = b.defaults.CPUMilli
	}
	if t.MemoryMB <= 0 {
		t.MemoryMB = b.defaults.MemoryMiB
	}
	if t.DiskMB <= 0 {
		t.DiskMB = b.defaults.DiskMiB
	}
}

// NodeTemplates is the Catalog of single-host mode: the templates some fresh
// node lists in its inventory, by name, without aliases. A template that
// only stale nodes hold is unknown, like one no node holds.
type NodeTemplates struct {
	src inventory.Source
}

var _ Catalog = NodeTemplates{}

// NewNodeTemplates returns the catalog of the templates src's fresh nodes
// list.
func NewNodeTemplates(src inventory.Source) NodeTemplates {
	return NodeTemplates{src: src}
}

// Templates implements Catalog.
func (c NodeTemplates) Templates(ctx context.Context) ([]e2bapi.Template, error) {
	nodes, err := c.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	byName := make(map[string]e2bapi.Template)
	for i := range nodes {
		for _, t := range nodes[i].Spec.Templates {
			if _, ok := byName[t.Name]; !ok {
				byName[t.Name] = nodeTemplate(t)
			}
		}
	}
	return slices.Collect(maps.Values(byName)), nil
}

// Template implements Catalog: the template name if a fresh node holds it.
func (c NodeTemplates) Template(ctx context.Context, name string) (*e2bapi.Template, error) {
	nodes, err := c.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("find template %s: list nodes: %w", name, err)
	}
	for i := range nodes {
		for _, t := range nodes[i].Spec.Templates {
			if t.Name == name {
				tmpl := nodeTemplate(t)
				return &tmpl, nil
			}
		}
	}
	return nil, fmt.Errorf("template %q: %w", name, e2bapi.ErrNotFound)
}

func nodeTemplate(t v1beta1.TemplateVersion) e2bapi.Template {
	return e2bapi.Template{ID: t.Name, Aliases: []string{}, Version: t.Version}
}

// aliasIndex is the cache field index from an alias to the SandboxTemplates
// that claim it.
const aliasIndex = "skiff.dev/sandboxtemplate-alias"

// TemplateCache is what SandboxTemplates needs from a controller-runtime
// cache (cache.Cache has both halves).
type TemplateCache interface {
	client.Reader
	client.FieldIndexer
}

// SandboxTemplates is the Catalog of Kubernetes mode: the cluster's
// SandboxTemplate objects, read through an informer cache. A template's ID
// is the object's name; spec.aliases are other names for it.
//
// A template is listed, and resolves, whether or not a fresh node holds
// it: a create of a template no fresh node can start is the placement's
// answer (503, no capacity), not an unknown template (400).
//
// A name is resolved as a template name first, then as an alias. An alias
// that two templates claim resolves to neither: the lookup answers a 400
// naming both, rather than picking one behind the caller's back.
type SandboxTemplates struct {
	reader client.Reader
	log    *slog.Logger
}

var _ Catalog = (*SandboxTemplates)(nil)

// NewSandboxTemplates registers the alias index on c and returns a catalog
// reading through it. Register it once per cache, before or after c starts.
// The server needs RBAC to list and watch sandboxtemplates.skiff.dev.
func NewSandboxTemplates(ctx context.Context, c TemplateCache, log *slog.Logger) (*SandboxTemplates, error) {
	if err := c.IndexField(ctx, &v1beta1.SandboxTemplate{}, aliasIndex, indexAliases); err != nil {
		return nil, fmt.Errorf("index SandboxTemplates by alias: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &SandboxTemplates{reader: c, log: log}, nil
}

func indexAliases(obj client.Object) []string {
	t, ok := obj.(*v1beta1.SandboxTemplate)
	if !ok {
		return nil
	}
	return t.Spec.Aliases
}

// Templates implements Catalog.
func (c *SandboxTemplates) Templates(ctx context.Context) ([]e2bapi.Template, error) {
	var list v1beta1.SandboxTemplateList
	// Read only, converted below: no copy needed.
	if err := c.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list SandboxTemplates: %w", err)
	}
	out := make([]e2bapi.Template, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, fromSandboxTemplate(&list.Items[i]))
	}
	return out, nil
}

// Template implements Catalog.
func (c *SandboxTemplates) Template(ctx context.Context, name string) (*e2bapi.Template, error) {
	var st v1beta1.SandboxTemplate
	err := c.reader.Get(ctx, client.ObjectKey{Name: name}, &st, client.UnsafeDisableDeepCopy)
	switch {
	case err == nil:
		t := fromSandboxTemplate(&st)
		return &t, nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get SandboxTemplate %s: %w", name, err)
	}
	var list v1beta1.SandboxTemplateList
	if err := c.reader.List(ctx, &list, client.MatchingFields{aliasIndex: name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("find SandboxTemplate by alias %s: %w", name, err)
	}
	switch len(list.Items) {
	case 0:
		return nil, fmt.Errorf("template %q: %w", name, e2bapi.ErrNotFound)
	case 1:
		t := fromSandboxTemplate(&list.Items[0])
		return &t, nil
	}
	names := make([]string, 0, len(list.Items))
	for i := range list.Items {
		names = append(names, list.Items[i].Name)
	}
	slices.Sort(names)
	c.log.WarnContext(ctx, "template alias claimed by more than one SandboxTemplate", "alias", name, "templates", names)
	return nil, e2bapi.Invalid("templateID", "alias %q names more than one template (%s); use a template name", name, strings.Join(names, ", "))
}

// fromSandboxTemplate converts a SandboxTemplate (possibly the cache's own
// object: it copies what it keeps). Its version, from which the e2b buildID
// is derived, is the object's generation: it changes whenever the spec does.
func fromSandboxTemplate(st *v1beta1.SandboxTemplate) e2bapi.Template {
	return e2bapi.Template{
		ID:          st.Name,
		Aliases:     slices.Clone(st.Spec.Aliases),
		Version:     strconv.FormatInt(st.Generation, 10),
		CPUMilli:    st.Spec.CPUMilli,
		MemoryMB:    st.Spec.MemoryMiB,
		DiskMB:      st.Spec.DiskMiB,
		EnvdVersion: st.Spec.EnvdVersion,
		CreatedAt:   st.CreationTimestamp.Time,
	}
}

// trimDefaultTag is name without a ":default" tag (of any case).
func trimDefaultTag(name string) string {
	if base, tag, ok := strings.Cut(name, ":"); ok && strings.EqualFold(tag, "default") {
		return base
	}
	return name
}
