// Package sdk runs the unmodified e2b JS SDK (sdk.test.mjs, once per pinned
// version) against the whole system started exactly as `make up` starts it:
// the real API, the envd proxy, sandboxd and real sandboxes.
package sdk

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
	"github.com/skiff-dev/skiff/shared/testing/egresstest"
)

// world starts the web servers and DNS server the outbound-rules cases
// reach (never an outside address) and returns sandboxd's flags that let
// sandboxes reach them and the suite's environment that names them.
func world(t *testing.T) (sandboxdArgs, env []string) {
	w := egresstest.NewWorld(t)
	return []string{"--allow-cidr", w.Subnet.String(), "--resolv-conf", w.ResolvConf},
		[]string{"SKIFF_WEB1=" + w.Web1.Addr, "SKIFF_WEB2=" + w.Web2.Addr}
}

// packages are the SDK versions under test (package.json's names); E2E_SDKS
// (space-separated) narrows them, and E2E_SDK_TESTS (node's
// --test-name-pattern) the cases.
var packages = []string{"e2b", "e2b-2.50.0", "e2b-2.45.0", "e2b-2.13.1"}

func TestSDK(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is needed: apt-get install nodejs npm")
	}
	if _, err := os.Stat("node_modules/e2b"); err != nil {
		t.Fatal("the SDKs are not installed: run `npm ci` in e2e/sdk (make sdk-deps does)")
	}
	args, env := world(t)
	sys := systemtest.StartWith(t, systemtest.Options{SandboxdArgs: args}, "team-a", "team-b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	want := packages
	if s := os.Getenv("E2E_SDKS"); s != "" {
		want = strings.Fields(s)
	}
	for _, pkg := range want {
		t.Run(pkg, func(t *testing.T) {
			args := []string{"--test", "--test-concurrency=1"}
			if p := os.Getenv("E2E_SDK_TESTS"); p != "" {
				args = append(args, "--test-name-pattern="+p)
			}
			cmd := exec.CommandContext(ctx, "node", append(args, "sdk.test.mjs")...)
			cmd.Env = append(append(os.Environ(), env...),
				"E2B_PACKAGE="+pkg,
				"E2B_API_URL="+sys.APIURL,
				"E2B_VOLUME_API_URL="+sys.APIURL,
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

// TestSDKDomain runs the suite with the newest SDK against the system in
// domain mode, given E2B_DOMAIN and the local CA only: the API, envd and the
// sandboxes' ports by name over TLS, presigned file URLs among them. The
// domain carries a port, so that the test needs neither port 443 nor
// leaves it to a `make up` on the machine.
func TestSDKDomain(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is needed: apt-get install nodejs npm")
	}
	if _, err := os.Stat("node_modules/e2b"); err != nil {
		t.Fatal("the SDKs are not installed: run `npm ci` in e2e/sdk (make sdk-deps does)")
	}
	sys, env := systemtest.StartDomain(t, systemtest.Options{}, "team-a", "team-b")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1",
		"--test-name-pattern=create, run as user|files write|presigned|a user port|private traffic|autoResume wakes|a snapshot starts|fork gives|volumes|e2b CLI", "sdk.test.mjs")
	env = append(env, "E2B_PACKAGE=e2b", "SKIFF_API_KEY_B="+sys.Keys["team-b"])
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("node --test (e2b, E2B_DOMAIN=%s):\n%s", sys.E2BDomain, out)
	if err != nil {
		t.Fatalf("the SDK suite failed in domain mode: %v", err)
	}
}

// TestSDKGvisor runs the suite's sandbox-state cases (snapshots, forks,
// pauses with and without memory, the base template) and its outbound
// rules with the newest SDK against a system whose
// sandboxd runs gVisor, where snapshots and forks keep memory and
// processes.
func TestSDKGvisor(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is needed: apt-get install nodejs npm")
	}
	if _, err := os.Stat("node_modules/e2b"); err != nil {
		t.Fatal("the SDKs are not installed: run `npm ci` in e2e/sdk (make sdk-deps does)")
	}
	runsc := os.Getenv("SKIFF_RUNSC")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("SKIFF_RUNSC=%q: %v (make runsc builds it)", runsc, err)
	}
	args, env := world(t)
	sys := systemtest.StartWith(t, systemtest.Options{Runtime: "gvisor", RunscPath: runsc, SandboxdArgs: args}, "team-a", "team-b")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1",
		"--test-name-pattern=create, run as user|snapshot|fork|keepMemory|allowOut|updateNetwork|volumes", "sdk.test.mjs")
	cmd.Env = append(append(os.Environ(), env...),
		"E2B_PACKAGE=e2b", "SKIFF_RUNTIME=gvisor",
		"E2B_API_URL="+sys.APIURL,
		"E2B_VOLUME_API_URL="+sys.APIURL,
		"E2B_SANDBOX_URL="+sys.SandboxURL,
		"E2B_API_KEY="+sys.Keys["team-a"],
		"SKIFF_API_KEY_B="+sys.Keys["team-b"],
	)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test (e2b on gVisor):\n%s", out)
	if err != nil {
		t.Fatalf("the SDK suite failed on gVisor: %v", err)
	}
}
