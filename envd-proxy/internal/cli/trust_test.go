package cli

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// The attack of issue 14, point 10, end to end on a real kube-apiserver
// with the proxy in kube mode, each host publishing with its own identity
// (a client certificate: skiff:node:<node> in skiff:nodes) and its sandboxd
// (a stand-in) accepting its own token, derived from the fleet key.
//
// Without the admission policy, host-a's identity rewrites host-b's
// NodeInventory to host-a's endpoint, and the proxy sends host-b's traffic
// there: host-a receives the sandbox's access token and host-b's node
// token, which host-b's sandboxd accepts. With api/policies installed the
// rewrite is refused and the traffic stays with host-b. An inventory of
// host-a's own that lists host-b's sandbox draws none of it, and one that
// names host-b's address as host-a's endpoint sends host-b host-a's token,
// which it refuses. (The proxy never routed another node's sandbox to an
// inventory that merely lists it: it asks only the nodes with the ID's tag.)
func TestKubeModeOneHostCannotTakeAnothersTraffic(t *testing.T) {
	env := kubetest.StartWith(t, kubetest.Options{NoPolicies: true})
	env.InstallRBAC(t)
	ctx := t.Context()
	key := []byte("fleet-key-of-the-trust-test-0123456789")
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	tokenA, tokenB := nodetoken.Derive(key, "host-a"), nodetoken.Derive(key, "host-b")
	a, b := newStandinWithToken(t, "host-a", tokenA), newStandinWithToken(t, "host-b", tokenB)
	hostA, hostB := env.NodeUser(t, "host-a").Client, env.NodeUser(t, "host-b").Client
	idA, idB := a.newSandbox(t), b.newSandbox(t)
	if err := publish(ctx, hostA, "host-a", a.endpoint(), time.Now(), idA); err != nil {
		t.Fatal(err)
	}
	if err := publish(ctx, hostB, "host-b", b.endpoint(), time.Now(), idB); err != nil {
		t.Fatal(err)
	}

	o := NewOptions()
	o.Inventory, o.Kubeconfig, o.NodeTokens.KeyFile = fleetsource.Kube, env.Kubeconfig(t), keyFile
	p := startProxy(t, o)
	const accessToken = "the-sandbox-access-token-of-host-b"
	send := func(id string) (int, string) {
		t.Helper()
		return httpGet(t, p.url+"/files?path=%2Fa", map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": accessToken})
	}
	relayedBy := func(host *standin, id string) bool {
		code, body := send(id)
		return code == http.StatusOK && body == "relayed by "+host.node+" to "+id+":49983"
	}
	for _, tc := range []struct {
		host  *standin
		id    string
		token string
	}{{a, idA, tokenA}, {b, idB, tokenB}} {
		if !relayedBy(tc.host, tc.id) {
			t.Fatalf("%s's sandbox is not relayed by it", tc.host.node)
		}
		if got := tc.host.lastHeader("Skiff-Node-Token"); got != tc.token {
			t.Fatalf("%s got node token %q, want its own", tc.host.node, got)
		}
	}

	// Without the policy: the attack works.
	if err := publish(ctx, hostA, "host-b", a.endpoint(), time.Now(), idB); err != nil {
		t.Fatalf("without the policy, host-a rewriting host-b's inventory: %v", err)
	}
	waitFor(t, "host-b's sandbox reaches host-a", func() bool {
		code, _ := send(idB)
		return code == http.StatusUnauthorized // host-a's stand-in: not its token
	})
	stolen, stolenAccess := a.lastHeader("Skiff-Node-Token"), a.lastHeader("X-Access-Token")
	if stolen != tokenB || stolenAccess != accessToken {
		t.Fatalf("host-a received node token %q and access token %q, want host-b's", stolen, stolenAccess)
	}
	if code, _ := httpGet(t, "http://"+b.endpoint()+"/", map[string]string{"E2b-Sandbox-Id": idB, "E2b-Sandbox-Port": "49983", "Skiff-Node-Token": stolen}); code != http.StatusOK {
		t.Fatalf("host-b's sandboxd refused the token host-a received: %d", code)
	}
	t.Log("without the policy host-a's identity took host-b's traffic and node token")

	// With the policy: refused, and host-b's own publish takes its traffic back.
	env.InstallPolicies(t)
	if err := publish(ctx, hostB, "host-b", b.endpoint(), time.Now(), idB); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "host-b's sandbox is back on host-b", func() bool { return relayedBy(b, idB) })
	err := publish(ctx, hostA, "host-b", a.endpoint(), time.Now(), idB)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "skiff:node:host-a may not") {
		t.Fatalf("with the policy, host-a rewriting host-b's inventory: %v, want Forbidden by the policy", err)
	}
	// host-a names host-b's address as its own endpoint, for a sandbox of
	// its own: host-b's address gets host-a's token, which it refuses.
	idA2 := a.newSandbox(t)
	if err := publish(ctx, hostA, "host-a", b.endpoint(), time.Now(), idA, idA2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "host-a's sandboxes go to host-b's address", func() bool {
		code, _ := send(idA2)
		return code == http.StatusUnauthorized
	})
	if got := b.lastHeader("Skiff-Node-Token"); got != tokenA {
		t.Errorf("host-b's address got node token %q, want host-a's own (which host-b refuses)", got)
	}
	// host-a's own inventory, at its own endpoint, lists host-b's sandbox:
	// it draws none of its traffic.
	if err := publish(ctx, hostA, "host-a", a.endpoint(), time.Now(), idA, idA2, idB); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "host-a's sandboxes are back on host-a", func() bool { return relayedBy(a, idA2) })
	relayedA := a.relayed.Load()
	for range 5 {
		if !relayedBy(b, idB) {
			t.Fatal("host-b's sandbox is not relayed by host-b")
		}
	}
	if a.relayed.Load() != relayedA {
		t.Errorf("host-a got %d requests for host-b's sandbox", a.relayed.Load()-relayedA)
	}
}
