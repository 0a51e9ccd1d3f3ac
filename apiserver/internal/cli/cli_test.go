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
