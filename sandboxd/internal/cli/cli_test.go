package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func TestTemplateCommands(t *testing.T) {
	state, src := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "--state-dir", state, "template", "import", "mini", "--dir", src)
	if err != nil || !strings.HasPrefix(out, "imported template mini version ") {
		t.Fatalf("import = %q, %v", out, err)
	}
	out, err = run(t, "--state-dir", state, "template", "list")
	if err != nil || !strings.Contains(out, "NAME") || !strings.Contains(out, "mini") {
		t.Fatalf("list = %q, %v", out, err)
	}
	for _, args := range [][]string{
		{"template", "import", "x"},
		{"template", "import", "x", "--dir", src, "--oci-archive", "f.tar"},
		{"template", "import", "--dir", src},
		{"template", "list", "extra"},
	} {
		if _, err := run(t, append([]string{"--state-dir", state}, args...)...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}
