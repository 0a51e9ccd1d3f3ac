// Package upstream runs e2b's own JS SDK tests, written by e2b for its
// cloud and copied unchanged but for their imports (js/tests, by
// hack/e2b-tests/vendor.sh; js/COMMIT names the commit, js/package.json
// pins the SDK of that commit, and the newest), and the e2b CLI's tests
// against a live backend (js/cli, with the published CLI), against the
// whole system started as `make up --domain` starts it, once with each
// SDK. js/skip.mjs lists the few it does not run, with why.
package upstream

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
)

func TestE2BSuite(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is needed: apt-get install nodejs npm")
	}
	if _, err := os.Stat("js/node_modules/.bin/vitest"); err != nil {
		t.Fatal("the suite's packages are not installed: run `npm ci` in e2e/upstream/js (make sdk-deps does)")
	}
	// Domain mode: the tests reach sandboxes' ports and presigned file
	// URLs by name, as against e2b's cloud; and no per-team limits, since
	// they create sandboxes faster than make up's 5 a second.
	sys, env := systemtest.StartDomain(t, systemtest.Options{NoTeamLimits: true}, "team-a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// The SDK of the tests' commit, then the newest (js/package.json).
	for _, pkg := range []string{"e2b", "e2b-2.51.0"} {
		t.Run(pkg, func(t *testing.T) {
			cmd := exec.CommandContext(ctx, "node_modules/.bin/vitest", "run", "--reporter=verbose", "--no-color")
			cmd.Dir = "js"
			// NO_UPDATE_NOTIFIER: the CLI would ask npm for a newer version.
			cmd.Env = append(slices.Clip(env), "NO_COLOR=1", "NO_UPDATE_NOTIFIER=1", "SKIFF_E2B_PACKAGE="+pkg)
			out, err := cmd.CombinedOutput()
			t.Logf("vitest run (e2b's tests at %s, %s, E2B_DOMAIN=%s):\n%s", commit(t), pkg, sys.E2BDomain, out)
			if err != nil {
				t.Fatalf("e2b's own SDK tests failed against Skiff with %s: %v", pkg, err)
			}
		})
	}
}

// commit is the e2b commit the tests were copied from.
func commit(t *testing.T) string {
	b, err := os.ReadFile("js/COMMIT")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
