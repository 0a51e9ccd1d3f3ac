// Package chart checks the Helm chart charts/skiff with the helm that make
// tools builds (bin/helm, or $SKIFF_BIN/helm): helm lint, its schema
// refusing a mistyped value, golden `helm template` outputs, the
// apiserver part rendering the very objects apiserver/deploy builds, a
// server-side dry run of every rendered object against a real
// kube-apiserver, the hosts' admission policy under real service account
// tokens, and the APIService becoming Available against a replica that
// runs with the chart's objects only.
//
// go test ./chart -update rewrites the golden files.
package chart

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/skiff-dev/skiff/e2e/internal/charttest"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/ from the chart")

// Release name and namespace of every render.
const (
	release   = charttest.Release
	namespace = charttest.Namespace
)

// valueSets are the renders the golden files and the dry run cover: the
// defaults, and the two files of testdata/.
var valueSets = []string{"default", "full", "control-plane-only"}

func repo(t testing.TB) string     { return charttest.Repo(t) }
func chartDir(t testing.TB) string { return charttest.Dir(t) }

func binary(t testing.TB, name string) string { return charttest.Binary(t, name) }

func runHelm(t testing.TB, args ...string) (string, error) { return charttest.Helm(t, args...) }

// valuesArgs are helm's arguments for a value set.
func valuesArgs(t testing.TB, set string) []string {
	if set == "default" {
		return nil
	}
	return []string{"--values", filepath.Join("testdata", set+".yaml")}
}

// render is helm template of the chart with a value set and extra
// arguments (--set ...): the manifest text.
func render(t testing.TB, set string, extra ...string) string {
	t.Helper()
	return charttest.Render(t, append(valuesArgs(t, set), extra...)...)
}

func objects(t testing.TB, manifest string) []*unstructured.Unstructured {
	return charttest.Objects(t, manifest)
}

func find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	return charttest.Find(objs, kind, ns, name)
}

// TestSourcesMatch: the chart's CRDs and policies are api/'s, byte for byte
// (make generate copies them).
func TestSourcesMatch(t *testing.T) {
	root := repo(t)
	for src, dst := range map[string]string{"api/crds": "charts/skiff/crds", "api/policies": "charts/skiff/files/policies"} {
		want := yamlFiles(t, filepath.Join(root, src))
		got := yamlFiles(t, filepath.Join(root, dst))
		if !slices.Equal(keys(want), keys(got)) {
			t.Errorf("%s has %v, %s %v: run make generate", dst, keys(got), src, keys(want))
			continue
		}
		for name, data := range want {
			if !bytes.Equal(data, got[name]) {
				t.Errorf("%s/%s differs from %s/%s: run make generate", dst, name, src, name)
			}
		}
	}
}

func yamlFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no YAML files in %s (%v)", dir, err)
	}
	out := map[string][]byte{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(p)] = data
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestLint: helm lint reports nothing, not even an INFO line, for every
// value set.
func TestLint(t *testing.T) {
	for _, set := range valueSets {
		out, err := runHelm(t, append([]string{"lint", chartDir(t), "--namespace", namespace}, valuesArgs(t, set)...)...)
		if err != nil || strings.Contains(out, "[ERROR]") || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[INFO]") {
			t.Errorf("helm lint (%s): %v\n%s", set, err, out)
		}
	}
}

// TestSchemaRefusesMistakes: a mistyped key, a value out of its enum and
// a wrong type fail helm template with a message naming the value.
func TestSchemaRefusesMistakes(t *testing.T) {
	for set, want := range map[string]string{
		"apiserver.replics=3":          "at '/apiserver': additional properties 'replics' not allowed",
		"hosts.runtime=kata":           "at '/hosts/runtime': value must be one of 'native', 'gvisor'",
		"apiserver.replicas=two":       "at '/apiserver/replicas': got string, want integer",
		"freshness.staleAfter=90":      "at '/freshness/staleAfter'",
		"hosts.nodeNamePrefix=Skiff_":  "at '/hosts/nodeNamePrefix'",
		"apiserver.servingCert.mode=x": "at '/apiserver/servingCert/mode': value must be one of 'self-signed', 'cert-manager'",
	} {
		out, err := runHelm(t, "template", release, chartDir(t), "--namespace", namespace, "--set", set)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("--set %s: %v, want an error with %q:\n%s", set, err, want, out)
		}
	}
	// Values that contradict each other fail with the template's message.
	for _, c := range []struct{ set, want string }{
		{"proxy.ingress.enabled=true", "proxy.ingress.enabled needs domain"},
		{"apiserver.ingress.enabled=true", "apiserver.ingress.enabled needs apiserver.ingress.host"},
		{"nodeToken.fleetKeySecret=key", "nodeToken.fleetKeySecret needs hosts.enabled=false"},
	} {
		out, err := runHelm(t, "template", release, chartDir(t), "--namespace", namespace, "--set", c.set)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("--set %s: %v, want an error with %q:\n%s", c.set, err, c.want, out)
		}
	}
}

// generated matches the lines whose values the chart generates at random
// on every render without a cluster (the node token, the serving
// certificate and its CA).
var generated = regexp.MustCompile(`(?m)^(\s+(?:token|ca\.crt|tls\.crt|tls\.key|caBundle)): \S+$`)

// TestGolden: helm template's output for each value set is the one in
// testdata/golden/, generated secrets aside.
func TestGolden(t *testing.T) {
	for _, set := range valueSets {
		got := generated.ReplaceAllString(render(t, set), "$1: <generated>")
		path := filepath.Join("testdata", "golden", set+".yaml")
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test ./chart -update writes it)", err)
		}
		if got != string(want) {
			t.Errorf("helm template (%s) differs from %s (go test ./chart -update rewrites it after a deliberate change):\n%s",
				set, path, lineDiff(string(want), got))
		}
	}
}

// lineDiff lists the first lines that differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 20; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  golden:   %s\n  rendered: %s\n", i+1, wl, gl)
			shown++
		}
	}
	return b.String()
}
