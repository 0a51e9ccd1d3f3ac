package envdproxy_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The proxy is a data-plane edge: it reads the fleet through shared/ and
// api/, never through another binary's module, and it is not an API server
// (k8s.io/apiserver stays out of it).
func TestDependencyBoundaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const own = "github.com/skiff-dev/skiff/"
	pkgs := strings.Fields(string(out))
	for _, pkg := range pkgs {
		if pkg == "k8s.io/apiserver" || strings.HasPrefix(pkg, "k8s.io/apiserver/") {
			t.Errorf("envd-proxy depends on %s", pkg)
		}
		if !strings.HasPrefix(pkg, own) {
			continue
		}
		mod, _, _ := strings.Cut(strings.TrimPrefix(pkg, own), "/")
		mod = strings.TrimSuffix(strings.TrimSuffix(mod, "_test"), ".test") // test packages
		if mod != "api" && mod != "shared" && mod != "wire" && mod != "envd-proxy" {
			t.Errorf("envd-proxy depends on %s, in the %s module", pkg, mod)
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list printed %d packages, want envd-proxy's dependencies", len(pkgs))
	}
}
