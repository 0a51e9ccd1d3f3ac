package wire_test

import (
	"os/exec"
	"strings"
	"testing"
)

// wire is imported by every module, envd included: it depends on the
// standard library alone.
func TestStandardLibraryOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		pkg = strings.Trim(pkg, "[]") // "p [p.test]": p as its test builds it
		if !strings.HasPrefix(pkg, "github.com/skiff-dev/skiff/wire") {
			t.Errorf("wire depends on %s", pkg)
		}
	}
}
