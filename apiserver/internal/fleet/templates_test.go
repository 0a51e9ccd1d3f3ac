package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/shared/placement"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// withCatalog returns a Backend over h's fleet whose templates come from
// catalog.
func withCatalog(t *testing.T, h *harness, catalog fleet.Catalog, defaults fleet.Defaults) *fleet.Backend {
	t.Helper()
	return fleet.New(fleet.Config{
		Source:  h.src,
		Placer:  placement.New(h.src, placement.Options{}),
		Catalog: catalog,
		Clients: func(_, endpoint string) sandboxdv1connect.SandboxdServiceClient {
			n, ok := h.nodes[endpoint]
			if !ok {
				t.Errorf("client asked for unknown endpoint %s", endpoint)
				return newFakeNode("unknown")
			}
			return n
		},
		Defaults: defaults,
	})
}

// mapCatalog is a Catalog of fixed templates, by ID.
type mapCatalog map[string]e2bapi.Template

func (m mapCatalog) Templates(context.Context) ([]e2bapi.Template, error) {
	var out []e2bapi.Template
	for _, t := range m {
		out = append(out, t)
	}
	return out, nil
}

func (m mapCatalog) Template(_ context.Context, name string) (*e2bapi.Template, error) {
	if t, ok := m[name]; ok {
		return &t, nil
	}
	return nil, fmt.Errorf("template %q: %w", name, e2bapi.ErrNotFound)
}

// A template's own resources go to sandboxd and placement; the ones it
// leaves at zero fall back to the Backend's defaults.
func TestCreateUsesTheTemplatesResources(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "big", "plain"))
	b := withCatalog(t, h, mapCatalog{
		"big":   {ID: "big", CPUMilli: 3000, MemoryMB: 2048, DiskMB: 4096},
		"plain": {ID: "plain"},
	}, fleet.Defaults{DiskMiB: 1000})

	sb, err := b.Create(t.Context(), "team1", params("big"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.CPUMilli != 3000 || sb.MemoryMB != 2048 {
		t.Errorf("big: cpu %d, memory %d; want the template's 3000, 2048", sb.CPUMilli, sb.MemoryMB)
	}
	sb, err = b.Create(t.Context(), "team1", params("plain"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.CPUMilli != fleet.DefaultCPUMilli || sb.MemoryMB != fleet.DefaultMemoryMiB {
		t.Errorf("plain: cpu %d, memory %d; want the defaults", sb.CPUMilli, sb.MemoryMB)
	}
	ts, err := b.Templates(t.Context(), "team1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].ID != "big" || ts[0].DiskMB != 4096 || ts[1].ID != "plain" ||
		ts[1].CPUMilli != fleet.DefaultCPUMilli || ts[1].MemoryMB != fleet.DefaultMemoryMiB || ts[1].DiskMB != 1000 || ts[1].Aliases == nil {
		t.Errorf("Templates = %+v, want big and plain (with the defaults), sorted", ts)
	}

	// A template the catalog has and no node holds: no capacity (503), not
	// an unknown template.
	b = withCatalog(t, h, mapCatalog{"gpu": {ID: "gpu"}}, fleet.Defaults{})
	if _, err := b.Create(t.Context(), "team1", params("gpu")); !errors.Is(err, e2bapi.ErrCapacity) {
		t.Errorf("Create(gpu) held by no node = %v, want ErrCapacity", err)
	}
}

func sandboxTemplate(name string, aliases ...string) *v1beta1.SandboxTemplate {
	return &v1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1beta1.SandboxTemplateSpec{Aliases: aliases, Source: v1beta1.TemplateSource{Builtin: "base"}},
	}
}

// eventually polls cond for at most 30 s: the cache follows the
// kube-apiserver asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SandboxTemplates read through an informer cache of a real kube-apiserver:
// names, aliases, the CRD's defaults, an alias claimed twice, edits and
// deletes.
func TestSandboxTemplates(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	c := env.Client
	for _, st := range []*v1beta1.SandboxTemplate{
		sandboxTemplate("base", "python", "py"),
		sandboxTemplate("node", "js"),
		sandboxTemplate("deno", "js"),
		sandboxTemplate("py", "snake"), // a name wins over another template's alias
	} {
		if err := c.Create(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	cache := env.StartCache(t, &v1beta1.SandboxTemplate{})
	catalog, err := fleet.NewSandboxTemplates(ctx, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, newFakeNode("node-a", "base"))
	b := withCatalog(t, h, catalog, fleet.Defaults{})

	ts, err := b.Templates(ctx, "team1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tm := range ts {
		ids = append(ids, tm.ID)
	}
	if !slices.Equal(ids, []string{"base", "deno", "node", "py"}) {
		t.Fatalf("Templates = %v", ids)
	}
	base := ts[0]
	if !slices.Equal(base.Aliases, []string{"python", "py"}) || base.CPUMilli != 1000 || base.MemoryMB != 512 || base.DiskMB != 1024 ||
		base.EnvdVersion != "0.6.0" || base.Version != "1" || base.CreatedAt.IsZero() {
		t.Errorf("base = %+v, want its aliases and the CRD's defaults", base)
	}

	for name, want := range map[string]string{"base": "base", "python": "base", "py": "py", "snake": "py", "node": "node"} {
		if tm, err := b.Template(ctx, "team1", name); err != nil || tm.ID != want {
			t.Errorf("Template(%s) = %+v, %v; want %s", name, tm, err, want)
		}
	}
	if _, err := b.Template(ctx, "team1", "ruby"); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("Template(ruby) = %v, want ErrNotFound", err)
	}
	var inv *e2bapi.InvalidError
	if _, err := b.Template(ctx, "team1", "js"); !errors.As(err, &inv) || inv.Field != "templateID" {
		t.Errorf("Template(js), claimed by node and deno, = %v; want an InvalidError on templateID", err)
	}

	// An edit shows (a new version, so a new e2b buildID); a delete removes.
	var st v1beta1.SandboxTemplate
	if err := c.Get(ctx, client.ObjectKey{Name: "base"}, &st); err != nil {
		t.Fatal(err)
	}
	st.Spec.CPUMilli = 4000
	st.Spec.Aliases = []string{"python3"}
	if err := c.Update(ctx, &st); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the edit reaches the catalog", func() bool {
		tm, err := b.Template(ctx, "team1", "python3")
		return err == nil && tm.ID == "base" && tm.CPUMilli == 4000 && tm.Version == "2"
	})
	if _, err := b.Template(ctx, "team1", "python"); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("Template(python) after the alias was dropped = %v, want ErrNotFound", err)
	}
	// The new resources reach sandboxd.
	sb, err := b.Create(ctx, "team1", params("base"))
	if err != nil || sb.CPUMilli != 4000 {
		t.Errorf("Create(base) = %+v, %v; want cpu 4000", sb, err)
	}
	if err := c.Delete(ctx, &st); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the delete reaches the catalog", func() bool {
		_, err := b.Template(ctx, "team1", "base")
		return errors.Is(err, e2bapi.ErrNotFound)
	})
}

// A template named with e2b's default tag is the template: "big:default"
// is "big", and a template's name is of any case; another tag is not.
func TestTemplateDefaultTag(t *testing.T) {
	h := newHarness(t, newFakeNode("node-a", "big"))
	b := withCatalog(t, h, mapCatalog{"big": {ID: "big"}}, fleet.Defaults{})
	for _, name := range []string{"big", "big:default", "big:DEFAULT", "BIG", "Big:Default"} {
		if tpl, err := b.Template(t.Context(), "team1", name); err != nil || tpl.ID != "big" {
			t.Errorf("Template(%q) = %+v, %v; want big", name, tpl, err)
		}
	}
	if _, err := b.Template(t.Context(), "team1", "big:v2"); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("Template(big:v2) = %v, want ErrNotFound", err)
	}
}
