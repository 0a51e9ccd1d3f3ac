package api_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// api is imported by every binary, so it imports only the standard library,
// k8s.io/apimachinery and k8s.io/api (tests included).
func TestImportsOnlyAPIMachinery(t *testing.T) {
	cmd := exec.Command("go", "list", "-test", "-json=ImportPath,Imports,TestImports,XTestImports,Standard", "./...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	allowed := []string{"k8s.io/apimachinery/", "k8s.io/api/", "github.com/skiff-dev/skiff/api"}
	dec := json.NewDecoder(out)
	seen := 0
	for {
		var pkg struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&pkg); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		seen++
		for _, imp := range append(append(pkg.Imports, pkg.TestImports...), pkg.XTestImports...) {
			if !strings.Contains(strings.Split(imp, "/")[0], ".") {
				continue // standard library
			}
			ok := false
			for _, p := range allowed {
				ok = ok || strings.HasPrefix(imp, p)
			}
			if !ok {
				t.Errorf("%s imports %s: api may import only k8s.io/apimachinery and k8s.io/api", pkg.ImportPath, imp)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if seen < 3 {
		t.Fatalf("go list saw %d packages, want the api packages", seen)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
