package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	stdout, _, err := runSplit(t, args...)
	return stdout, err
}

// runSplit runs the command and returns what it wrote to stdout and to
// stderr apart.
func runSplit(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := NewCommand()
	var out, diag bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&diag)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(t.Context())
	return out.String(), diag.String(), err
}

func TestKeysCreateAppendsAKeyTheFileStoreAccepts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	first, err := run(t, "keys", "create", "--team", "team-a", "--api-keys-file", file)
	if err != nil {
		t.Fatal(err)
	}
	second, err := run(t, "keys", "create", "--team", "team-b", "--api-keys-file", file)
	if err != nil {
		t.Fatal(err)
	}
	keyA, keyB := strings.TrimSpace(first), strings.TrimSpace(second)
	if !auth.ValidKey(keyA) || !auth.ValidKey(keyB) || keyA == keyB {
		t.Fatalf("printed %q and %q", keyA, keyB)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("keys file: %v, %v", st, err)
	}
	store, err := auth.NewFileStore(file, auth.FileStoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for key, want := range map[string]string{keyA: "team-a", keyB: "team-b"} {
		if team, err := store.Team(t.Context(), key); err != nil || team != want {
			t.Errorf("team of a created key: %q, %v; want %q", team, err, want)
		}
	}
}

func TestKeysCreateRefusesBadInput(t *testing.T) {
	// Without --api-keys-file the key goes to Kubernetes: with no cluster
	// to be found, that fails.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "no-such-kubeconfig"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	file := filepath.Join(t.TempDir(), "keys")
	for name, args := range map[string][]string{
		"bad team":            {"keys", "create", "--team", "Team_A", "--api-keys-file", file},
		"no team":             {"keys", "create", "--api-keys-file", file},
		"no file, no cluster": {"keys", "create", "--team", "team-a"},
		"file and kubeconfig": {"keys", "create", "--team", "team-a", "--api-keys-file", file, "--kubeconfig", file + ".kubeconfig"},
		"extra arg":           {"keys", "create", "--team", "team-a", "--api-keys-file", file, "more"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("a refused create wrote the file: %v", err)
	}
}

func TestNodeTokenPrintsTheDerivedToken(t *testing.T) {
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "node-token", "--key-file", key, "host-a")
	// printf host-a | openssl dgst -sha256 -hmac 0123456789abcdef0123456789abcdef
	if err != nil || out != "e9fcac7952749dc54be33b7022727d2eb732084334f1ffc7966771a9eab3aae6\n" {
		t.Fatalf("node-token = %q, %v", out, err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no key file":     {[]string{"node-token", "host-a"}, "--key-file is required"},
		"no node":         {[]string{"node-token", "--key-file", key}, "accepts 1 arg"},
		"two nodes":       {[]string{"node-token", "--key-file", key, "host-a", "host-b"}, "accepts 1 arg"},
		"bad node name":   {[]string{"node-token", "--key-file", key, "Host_A"}, `node "Host_A"`},
		"missing key":     {[]string{"node-token", "--key-file", key + ".missing", "host-a"}, "read --key-file"},
		"too short a key": {[]string{"node-token", "--key-file", short, "host-a"}, "at least 32 bytes"},
	} {
		if out, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) || out != "" {
			t.Errorf("%s: %q, %v; want an error with %q", name, out, err, tc.want)
		}
	}
}
