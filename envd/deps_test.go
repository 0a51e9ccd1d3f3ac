package envd_test

import (
	"os/exec"
	"strings"
	"testing"
)

// envd is copied into every sandbox: it depends on nothing from Kubernetes
// and on no other Skiff module but wire (stdlib only).
func TestNoKubernetesDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := strings.Fields(string(out))
	for _, pkg := range pkgs {
		if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/") {
			t.Errorf("envd depends on %s", pkg)
		}
		if rest, ok := strings.CutPrefix(pkg, "github.com/skiff-dev/skiff/"); ok && !strings.HasPrefix(rest, "envd") && !strings.HasPrefix(rest, "wire") {
			t.Errorf("envd depends on %s, outside its module", pkg)
		}
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list printed %d packages, want envd's dependencies", len(pkgs))
	}
}
