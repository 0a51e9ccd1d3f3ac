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

func TestTemplateBuild(t *testing.T) {
	state := t.TempDir()
	out, err := run(t, "--state-dir", state, "template", "build", "python")
	if err == nil || !strings.Contains(err.Error(), `only the built-in template "base" can be built`) {
		t.Errorf("build python = %q, %v", out, err)
	}
	for _, args := range [][]string{{"template", "build"}, {"template", "build", "base", "extra"}} {
		if _, err := run(t, append([]string{"--state-dir", state}, args...)...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("building needs root")
	}
	// A debootstrap that makes a tiny root filesystem stands in for the
	// real one (which the template package's tests run).
	bin := t.TempDir()
	fake := `#!/bin/sh
set -e
eval "target=\${$(($# - 1))}"
mkdir -p "$target/etc" "$target/home" "$target/tmp"
echo 'root:x:0:0:root:/root:/bin/bash' > "$target/etc/passwd"
echo 'root:x:0:' > "$target/etc/group"
echo 'root:*:19000:0:99999:7:::' > "$target/etc/shadow"
echo "I: debootstrap $*"
`
	if err := os.WriteFile(filepath.Join(bin, "debootstrap"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	cache := t.TempDir()
	args := []string{"--state-dir", state, "template", "build", "base", "--suite", "trixie", "--mirror", "http://m.example/debian", "--cache-dir", cache}
	out, err = run(t, args...)
	if err != nil || !strings.Contains(out, "I: debootstrap --variant=minbase") || !strings.Contains(out, " trixie ") || !strings.Contains(out, "http://m.example/debian") {
		t.Fatalf("build base = %q, %v", out, err)
	}
	i := strings.LastIndex(out, "built template base version ")
	if i < 0 {
		t.Fatalf("build base printed no version: %q", out)
	}
	first := out[i:]
	out, err = run(t, args...)
	if err != nil || !strings.Contains(out, "using the cached root filesystem "+cache) || !strings.HasSuffix(out, first) {
		t.Errorf("second build = %q, %v; want the cached %q", out, err, first)
	}
	out, err = run(t, "--state-dir", state, "template", "list")
	if err != nil || !strings.Contains(out, "base") {
		t.Errorf("list = %q, %v", out, err)
	}
}

// serve refuses logging flags it cannot honour before it touches the state
// directory or the host.
func TestServeRefusesBadLogFlags(t *testing.T) {
	for flag, value := range map[string]string{"--log-level": "loud", "--log-format": "xml"} {
		state := filepath.Join(t.TempDir(), "state")
		_, err := run(t, "--state-dir", state, "serve", "--node-name", "test-host", "--auth-token-file", "/nonexistent", flag, value)
		if want := flag + ` "` + value + `"`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("serve %s %s = %v, want an error naming %s", flag, value, err, want)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Errorf("serve %s %s made its state directory (%v)", flag, value, err)
		}
	}
}

// serve refuses process limits and egress prefixes that cannot work
// before it changes the host (kernel.pid_max, the sandboxes' cgroup) or
// its state directory.
func TestServeRefusesBadPidsFlags(t *testing.T) {
	for flag, value := range map[string]string{"--pids-limit": "0", "--host-pids-reserve": "-1", "--deny-cidr": "10.0.0.0/33", "--allow-cidr": "fd00::/8"} {
		state := filepath.Join(t.TempDir(), "state")
		_, err := run(t, "--state-dir", state, "serve", "--node-name", "test-host", "--insecure-no-auth", flag, value)
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("serve %s %s = %v, want an error naming %s", flag, value, err, flag)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Errorf("serve %s %s made its state directory (%v)", flag, value, err)
		}
	}
}
