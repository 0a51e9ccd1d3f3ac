package vksandbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// vk-sandbox reads sandboxd and the fleet's types through shared/ and api/,
// never through another binary's module (its end-to-end test builds those as
// programs), and the binary carries no controller-runtime: its reads are
// client-go informers of its own pods and node.
func TestDependencyBoundaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const own = "github.com/skiff-dev/skiff/"
	pkgs := strings.Fields(string(out))
	for _, pkg := range pkgs {
		if !strings.HasPrefix(pkg, own) {
			continue
		}
		mod, _, _ := strings.Cut(strings.TrimPrefix(pkg, own), "/")
		mod = strings.TrimSuffix(strings.TrimSuffix(mod, "_test"), ".test") // test packages
		if mod != "api" && mod != "shared" && mod != "wire" && mod != "vk-sandbox" {
			t.Errorf("vk-sandbox depends on %s, in the %s module", pkg, mod)
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list printed %d packages, want vk-sandbox's dependencies", len(pkgs))
	}
	out, err = exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./cmd/vk-sandbox").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for pkg := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(pkg, "sigs.k8s.io/controller-runtime") {
			t.Errorf("the vk-sandbox binary depends on %s", pkg)
		}
	}
}
