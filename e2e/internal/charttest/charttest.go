// Package charttest renders the Helm chart charts/skiff with the pinned
// helm (make tools: bin/helm, or $SKIFF_BIN/helm) for tests: e2e/chart's
// checks, and the fleet, whose hosts get the chart's RBAC.
package charttest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Release name and namespace of every render.
const (
	Release   = "skiff"
	Namespace = "skiff-system"
)

// Repo is the repository's root (the folder of go.work).
func Repo(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.work above the test's directory")
		}
		dir = parent
	}
}

// Dir is the chart's directory.
func Dir(t testing.TB) string { return filepath.Join(Repo(t), "charts", "skiff") }

// Binary is a program of $SKIFF_BIN, else of bin/: the pinned helm (make
// tools), the daemons (make build).
func Binary(t testing.TB, name string) string {
	t.Helper()
	for _, dir := range []string{os.Getenv("SKIFF_BIN"), filepath.Join(Repo(t), "bin")} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	t.Fatalf("no %s in $SKIFF_BIN or bin/: run make tools build", name)
	return ""
}

// Helm runs helm with args, returning its combined output; it reads no
// user's helm configuration or cache.
func Helm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.CommandContext(t.Context(), Binary(t, "helm"), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	err := cmd.Run()
	return out.String(), err
}

// Render is helm template of the chart (CRDs included) with args (--values
// FILE, --set K=V): the manifest text.
func Render(t testing.TB, args ...string) string {
	t.Helper()
	out, err := Helm(t, append([]string{"template", Release, Dir(t), "--namespace", Namespace, "--include-crds"}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	return out
}

// Objects parses a manifest into its objects, in order.
func Objects(t testing.TB, manifest string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("parse the rendered manifest: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Find returns the rendered object of that kind, namespace and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	return nil
}
