package hosttest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// Inside the tests, /root is an empty tmpfs and /home one too; what a test
// makes there, the host does not see.
func TestHomesAreHidden(t *testing.T) {
	if os.Geteuid() == 0 {
		for _, d := range homes {
			ents, err := os.ReadDir(d)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if len(ents) != 0 {
				t.Fatalf("%s has %d entries (%s…), want none", d, len(ents), ents[0].Name())
			}
		}
	}
	AssertHidden(t)
}

// A marker set by hand does not get tests past the guard: the test binary
// run in the host's mount namespace with the marker refuses to run them
// (-test.run=^$ runs none, should the refusal be broken).
func TestMarkerAloneIsNoGuard(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: no guard")
	}
	pid, err := outsidePID()
	if err != nil {
		t.Fatal(err)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Skip(err)
	}
	cmd := exec.Command(nsenter, fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), "--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", markerEnv, pid))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "the homes are not hidden") {
		t.Fatalf("run outside with the marker: %v\n%s", err, out)
	}
}

// writeEnv asks TestWriteIntoTheFuzzCache, run by TestFuzzCacheIsTheHosts,
// to write this text into its fuzz cache.
const writeEnv = "SKIFF_HOSTTEST_WRITE"

// A fuzz run's cache (under /root, which the tmpfs hides) is the host's
// folder inside: what the run writes there stays after it. The test binary
// is run again, as a fresh start would be, from inside this run's
// namespace, whose /root (a tmpfs) is that run's host; it writes into its
// fuzz cache there, and the file must be here after it ends.
func TestFuzzCacheIsTheHosts(t *testing.T) {
	if os.Getenv(markerEnv) == "" {
		t.Skip("not root: no guard")
	}
	dir := filepath.Join("/root", "fuzzcache-"+t.Name())
	hidden := filepath.Join("/root", "hidden-"+t.Name())
	if err := os.WriteFile(hidden, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir); _ = os.Remove(hidden) })
	cmd := exec.Command(os.Args[0], "-test.run=^TestWriteIntoTheFuzzCache$", "-test.v", "-test.fuzzcachedir="+dir)
	cmd.Env = []string{writeEnv + "=kept", "SKIFF_HOSTTEST_HIDDEN=" + hidden}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, markerEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestWriteIntoTheFuzzCache") {
		t.Fatalf("the test binary run again with -test.fuzzcachedir=%s: %v\n%s", dir, err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, "written"))
	if err != nil || string(got) != "kept" {
		t.Fatalf("what the run wrote into its fuzz cache, read after it: %q, %v; want %q", got, err, "kept")
	}
}

// TestWriteIntoTheFuzzCache is TestFuzzCacheIsTheHosts's run inside: it
// checks that the rest of the home is hidden and writes into the cache.
func TestWriteIntoTheFuzzCache(t *testing.T) {
	text := os.Getenv(writeEnv)
	if text == "" {
		t.Skip("run by TestFuzzCacheIsTheHosts")
	}
	if _, err := os.Stat(os.Getenv("SKIFF_HOSTTEST_HIDDEN")); !os.IsNotExist(err) {
		t.Fatalf("a file of the home outside is seen inside (%v): the home is not hidden", err)
	}
	dir := flag.Lookup("test.fuzzcachedir").Value.String()
	if err := os.WriteFile(filepath.Join(dir, "written"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFuzzCacheDir(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-test.run=^$", "-test.fuzzcachedir=/root/.cache/go-build/fuzz/x"}, "/root/.cache/go-build/fuzz/x"},
		{[]string{"--test.fuzzcachedir", "/c"}, "/c"},
		{[]string{"-test.fuzzcachedir"}, ""},
		{[]string{"-test.fuzz=^F$", "-test.fuzzcachedirx=/c"}, ""},
		{nil, ""},
	} {
		if got := fuzzCacheDir(c.args); got != c.want {
			t.Errorf("fuzzCacheDir(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`: "/a b",
		`/plain`:  "/plain",
		`/x\`:     `/x\`,
		`/x\04`:   `/x\04`,
		`\134`:    `\`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
