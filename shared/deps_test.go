package shared_test

import (
	"os/exec"
	"strings"
	"testing"
)

// shared is what the binaries have in common, so it depends on no binary's
// module: of Skiff's own modules, only api and shared itself.
func TestDependsOnNoBinaryModule(t *testing.T) {
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
		if mod != "api" && mod != "shared" && mod != "wire" {
			t.Errorf("shared depends on %s, in the %s module", pkg, mod)
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list printed %d packages, want shared's dependencies", len(pkgs))
	}
}
