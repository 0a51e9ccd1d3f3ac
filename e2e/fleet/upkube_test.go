package fleet

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// TestUpKube is make up-kube: the fleet, long-running, until Ctrl-C. It
// runs only with SKIFF_UP_KUBE=1, with the real defaults (a 30 s publish
// interval and a 90 s window) unless SKIFF_FLEET_INTERVAL and
// SKIFF_FLEET_WINDOW say otherwise.
func TestUpKube(t *testing.T) {
	if os.Getenv("SKIFF_UP_KUBE") != "1" {
		t.Skip("make up-kube runs it (SKIFF_UP_KUBE=1)")
	}
	for env, def := range map[string]string{"SKIFF_FLEET_INTERVAL": "30s", "SKIFF_FLEET_WINDOW": "90s"} {
		if os.Getenv(env) == "" {
			t.Setenv(env, def)
		}
	}
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(assets, "kubectl")
	f := newFleet(t, configFromEnv(t))
	logf(`
The fleet runs: hosts %s (%s) and %s (%s), sandbox-apiserver replicas on %s and %s, the envd proxy on %s.
Point an e2b SDK at it (team-a; team-b's key: %s):

  export E2B_API_URL=%s
  export E2B_SANDBOX_URL=%s
  export E2B_VOLUME_API_URL=%s
  export E2B_API_KEY=%s

and watch it from Kubernetes:

  export KUBECONFIG=%s
  %s get sandboxes -A -w

Logs: %s. Ctrl-C stops everything and removes what the fleet made.`,
		hostA, f.hosts[hostA].ns.Addr, hostB, f.hosts[hostB].ns.Addr, f.replicas[0].api, f.replicas[1].api, f.proxyURL, f.keyB,
		f.replicas[0].api, f.proxyURL, f.replicas[0].api, f.key, f.kc, kubectl, f.logs)
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
			for name, h := range f.hosts {
				if !h.h.Sandboxd.Running() || !h.vk.Running() {
					logf("fleet: %s has a component down (sandboxd running %v, vk-sandbox running %v); see its logs", name, h.h.Sandboxd.Running(), h.vk.Running())
				}
			}
		}
	}
}
