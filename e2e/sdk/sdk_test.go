// Package sdk runs the unmodified e2b JS SDK (sdk.test.mjs, once per pinned
// version) against the whole system started exactly as `make up` starts it:
// the real API, the envd proxy, sandboxd and real sandboxes.
package sdk

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/system"
)

// packages are the SDK versions under test (package.json's names); E2B_SDKS
// (space-separated) narrows them.
var packages = []string{"e2b", "e2b-2.50.0", "e2b-2.13.1"}

func TestSDK(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxd runs sandboxes")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is needed: apt-get install nodejs npm")
	}
	if _, err := os.Stat("node_modules/e2b"); err != nil {
		t.Fatal("the SDKs are not installed: run `npm ci` in e2e/sdk (make sdk-test does)")
	}
	bin := os.Getenv("SKIFF_BIN")
	if bin == "" {
		bin = buildAll(t)
	}
	// Not t.TempDir: its parent is 0700, and sandboxes reach their root
	// filesystem through the state directory.
	state, err := os.MkdirTemp("", "skiff-sdk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(state); err != nil {
			t.Errorf("remove %s: %v", state, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	suffix := fmt.Sprintf("%03x", rand.IntN(0xfff))
	addrs := make([]string, 5)
	for i := range addrs {
		a, err := system.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = a
	}
	cfg := system.Config{
		Bin: bin, State: state, RunDir: filepath.Join(state, "run"),
		APIListen: addrs[0], ProxyListen: addrs[1], ProxyAdmin: addrs[2], SandboxdListen: addrs[3], SandboxdAdmin: addrs[4],
		Teams:    []string{"team-a", "team-b"},
		NodeName: "sdk-host",
		NFTTable: "skiff_sdk_" + suffix, CgroupParent: "skiff-sdk-" + suffix, IfacePrefix: "k" + suffix,
		SandboxCIDR: fmt.Sprintf("10.%d.%d.0/22", 100+rand.IntN(100), rand.IntN(64)*4),
		Progress:    testWriter{t},
	}
	sys, err := system.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sys.Stop(context.Background()); err != nil {
			t.Errorf("stop the system: %v", err)
		}
		if t.Failed() {
			t.Logf("sandboxd log:\n%s", sys.LogTail("sandboxd", 60))
			t.Logf("apiserver log:\n%s", sys.LogTail("sandbox-apiserver", 40))
			t.Logf("proxy log:\n%s", sys.LogTail("sandbox-envd-proxy", 40))
		}
	})

	want := packages
	if s := os.Getenv("E2E_SDKS"); s != "" {
		want = strings.Fields(s)
	}
	for _, pkg := range want {
		t.Run(pkg, func(t *testing.T) {
			cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "sdk.test.mjs")
			cmd.Env = append(os.Environ(),
				"E2B_PACKAGE="+pkg,
				"E2B_API_URL="+sys.APIURL,
				"E2B_SANDBOX_URL="+sys.SandboxURL,
				"E2B_API_KEY="+sys.Keys["team-a"],
				"SKIFF_API_KEY_B="+sys.Keys["team-b"],
			)
			out, err := cmd.CombinedOutput()
			t.Logf("node --test (%s):\n%s", pkg, out)
			if err != nil {
				t.Fatalf("the SDK suite failed with %s: %v", pkg, err)
			}
		})
	}
}

// buildAll builds the system's binaries into a temporary directory.
func buildAll(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []struct{ pkg, out, cgo string }{
		{"github.com/skiff-dev/skiff/sandboxd/cmd/sandboxd", "sandboxd", "1"},
		{"github.com/skiff-dev/skiff/envd/cmd/envd", "envd", "0"},
		{"github.com/skiff-dev/skiff/apiserver/cmd/sandbox-apiserver", "sandbox-apiserver", "0"},
		{"github.com/skiff-dev/skiff/envd-proxy/cmd/sandbox-envd-proxy", "sandbox-envd-proxy", "0"},
	} {
		cmd := exec.Command("go", "build", "-tags=seccomp", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return dir
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
