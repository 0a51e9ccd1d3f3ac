// Package systemtest starts the whole system (internal/system, the code
// path of `make up`) for a test or benchmark, on free loopback ports and
// with its own host resources, and stops it when the test ends.
package systemtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/system"
	"github.com/skiff-dev/skiff/shared/testing/forwardtest"
)

// Start runs the system with a key for each team. It skips the test
// when not root. The binaries come from $SKIFF_BIN (make build), else they
// are built into a temporary directory.
func Start(tb testing.TB, teams ...string) *system.System {
	tb.Helper()
	return StartWith(tb, Options{}, teams...)
}

// Options change the system Start runs.
type Options struct {
	// Env is added to the servers' environment (system.Config.Env).
	Env []string
	// Runtime and RunscPath are sandboxd's --runtime and --runsc (the
	// native runtime when empty).
	Runtime, RunscPath string
	// Domain and DomainPort turn domain mode on (system.Config).
	Domain, DomainPort string
	// SandboxdArgs are more flags for sandboxd (system.Config).
	SandboxdArgs []string
	// NoTeamLimits turns make up's per-team create rate and sandbox limit
	// off, for a suite that creates faster than 5 a second (e2b's own).
	NoTeamLimits bool
}

// StartWith is Start with options.
func StartWith(tb testing.TB, o Options, teams ...string) *system.System {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: sandboxd runs sandboxes")
	}
	bin := os.Getenv("SKIFF_BIN")
	if bin == "" {
		bin = buildAll(tb)
	}
	// sandboxd turns IPv4 forwarding on, and its sandboxes' traffic to
	// anything beyond this host (the SDK suite's web servers, in network
	// namespaces of the test) needs it until the system stops. Without a
	// hold, the last of the other test binaries holding it (the fleet
	// lanes, run beside this one by go test) put back the machine's value,
	// off on a fresh CI machine, under this system's sandboxes: the SDK
	// suite's allowOut case then found its web server unreachable until
	// another test's sandboxd turned forwarding on again.
	forwardtest.Keep(tb)
	// Not tb.TempDir: its parent is 0700, and sandboxes reach their root
	// filesystem through the state directory.
	state, err := os.MkdirTemp("", "skiff-system-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(state); err != nil {
			tb.Errorf("remove %s: %v", state, err)
		}
	})
	cfg, err := system.LocalConfig(bin, state, teams...)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MemoryOvercommit = system.DefaultMemoryOvercommit
	// make up's per-team limits: the SDK suite stays within them (it
	// creates one sandbox at a time, slower than 5 a second, and holds no
	// more than a few at once), as an SDK user's code would.
	cfg.CreateRatePerTeam, cfg.CreateBurstPerTeam = system.DefaultCreateRatePerTeam, system.DefaultCreateBurstPerTeam
	cfg.MaxSandboxesPerTeam = system.DefaultMaxSandboxesPerTeam
	if o.NoTeamLimits {
		cfg.CreateRatePerTeam, cfg.MaxSandboxesPerTeam = 0, 0
	}
	cfg.Env, cfg.Runtime, cfg.RunscPath, cfg.SandboxdArgs = o.Env, o.Runtime, o.RunscPath, o.SandboxdArgs
	cfg.Domain, cfg.DomainPort = o.Domain, o.DomainPort
	cfg.Progress = testWriter{tb}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sys, err := system.Start(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, name := range []string{"sandboxd", "sandbox-apiserver", "sandbox-envd-proxy"} {
				tb.Logf("%s log:\n%s", name, sys.LogTail(name, 40))
			}
		}
		if err := sys.Stop(context.Background()); err != nil {
			tb.Errorf("stop the system: %v", err)
		}
	})
	return sys
}

// buildAll builds the system's binaries into a temporary directory.
func buildAll(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	for _, b := range []struct{ pkg, out, cgo string }{
		{"github.com/skiff-dev/skiff/sandboxd/cmd/sandboxd", "sandboxd", "1"},
		{"github.com/skiff-dev/skiff/envd/cmd/envd", "envd", "0"},
		{"github.com/skiff-dev/skiff/apiserver/cmd/sandbox-apiserver", "sandbox-apiserver", "0"},
		{"github.com/skiff-dev/skiff/envd-proxy/cmd/sandbox-envd-proxy", "sandbox-envd-proxy", "0"},
	} {
		cmd := exec.Command("go", "build", "-tags=seccomp", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return dir
}

type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// StartDomain is StartWith in domain mode (o.Domain "skiff.localhost" on a
// free port), and returns with the system the environment that points an
// unmodified JS SDK at it: this process's, without its E2B_ variables, and
// E2B_DOMAIN, NODE_EXTRA_CA_CERTS and E2B_API_KEY (the first team's key).
func StartDomain(tb testing.TB, o Options, teams ...string) (*system.System, []string) {
	tb.Helper()
	addr, err := system.FreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	_, port, _ := strings.Cut(addr, ":")
	o.Domain, o.DomainPort = "skiff.localhost", port
	sys := StartWith(tb, o, teams...)
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "E2B_") {
			env = append(env, e)
		}
	}
	env = append(env, "E2B_DOMAIN="+sys.E2BDomain, "NODE_EXTRA_CA_CERTS="+sys.DomainFiles.CA, "E2B_API_KEY="+sys.Keys[teams[0]])
	return sys, env
}
