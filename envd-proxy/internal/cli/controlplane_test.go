package cli

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// publish server-side-applies a node's inventory stamped at, as vk-sandbox
// does.
func publish(ctx context.Context, c client.Client, node, endpoint string, at time.Time, ids ...string) error {
	inv := &v1beta1.NodeInventory{
		TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta:  metav1.ObjectMeta{Name: node},
		PublishedAt: &metav1.Time{Time: at},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: endpoint,
			Capacity: v1beta1.NodeCapacity{CPUMilli: 4000, MemoryMiB: 8192, Sandboxes: 10},
		},
	}
	for _, id := range ids {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{
			ID: id, Template: "base", State: v1beta1.SandboxRunning, Team: "team-a", StartedAt: v1beta1.NewMicroTime(time.Now()),
			Metadata: map[string]string{"owner": "test"},
		})
	}
	//nolint:staticcheck // client.Apply with a typed object is how vk-sandbox publishes until it moves to apply configurations.
	return c.Patch(ctx, inv, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership)
}

// Two nodes publish to a real kube-apiserver, each with a stand-in
// sandboxd. Node A keeps publishing; node B stops. Once B is stale, its
// sandbox gets e2b's 502 and B's listener sees no new connection; requests
// for unknown sandboxes get 502 without any listener seeing a connection.
func TestKubeModeStaleNodeGetsNoTraffic(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	a, b := newStandin(t, "node-a"), newStandin(t, "node-b")
	idA, idB := a.newSandbox(t), b.newSandbox(t)
	if err := publish(ctx, env.Client, "node-a", a.endpoint(), time.Now(), idA); err != nil {
		t.Fatal(err)
	}
	if err := publish(ctx, env.Client, "node-b", b.endpoint(), time.Now(), idB); err != nil {
		t.Fatal(err)
	}

	o := NewOptions()
	o.Inventory, o.Kubeconfig = fleetsource.Kube, env.Kubeconfig(t)
	o.Stale.StaleAfter = 3 * time.Second
	p := startProxy(t, o)

	for _, tc := range []struct {
		id   string
		host *standin
	}{{idA, a}, {idB, b}} {
		code, body := p.send(t, tc.id)
		if code != http.StatusOK || body != "relayed by "+tc.host.node+" to "+tc.id+":49983" {
			t.Fatalf("%s while fresh: %d %q", tc.host.node, code, body)
		}
	}

	// node-a publishes every 500 ms; node-b never again.
	pubCtx, stopPublishing := context.WithCancel(ctx)
	var pubWG sync.WaitGroup
	pubErr := make(chan error, 1)
	pubWG.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-pubCtx.Done():
				return
			case <-tick.C:
				if err := publish(pubCtx, env.Client, "node-a", a.endpoint(), time.Now(), idA); err != nil && pubCtx.Err() == nil {
					pubErr <- err
					return
				}
			}
		}
	})
	defer func() { stopPublishing(); pubWG.Wait() }()

	lastStampB := time.Now()
	waitFor(t, "node-b's sandbox answers 502", func() bool {
		select {
		case err := <-pubErr:
			t.Fatalf("publish node-a: %v", err)
		default:
		}
		code, body := p.send(t, idB)
		if code != http.StatusOK && code != http.StatusBadGateway {
			t.Fatalf("node-b's sandbox: %d %q", code, body)
		}
		return code == http.StatusBadGateway
	})
	t.Logf("node-b left routing %s after its last stamp (window %s)", time.Since(lastStampB).Round(time.Millisecond), o.Stale.StaleAfter)

	acceptsB, relayedB := b.accepts.Load(), b.relayed.Load()
	for range 10 {
		code, body := p.send(t, idB)
		if code != http.StatusBadGateway || !strings.Contains(body, `"sandboxId":"`+idB+`"`) {
			t.Fatalf("node-b's sandbox once stale: %d %q", code, body)
		}
	}
	if code, _ := p.send(t, idA); code != http.StatusOK {
		t.Fatalf("node-a's sandbox: %d", code)
	}
	if b.accepts.Load() != acceptsB || b.relayed.Load() != relayedB {
		t.Fatalf("stale node-b saw traffic: accepts %d→%d, requests %d→%d", acceptsB, b.accepts.Load(), relayedB, b.relayed.Load())
	}

	// Unknown sandboxes: valid IDs of tags no node has, and IDs that are
	// not sandbox IDs at all.
	acceptsA, relayedA := a.accepts.Load(), a.relayed.Load()
	var unknown []string
	for i := 0; len(unknown) < 15; i++ {
		tag := sandboxid.NodeTag(fmt.Sprintf("node-nowhere-%d", i))
		if tag == sandboxid.NodeTag("node-a") || tag == sandboxid.NodeTag("node-b") {
			continue
		}
		id, err := sandboxid.New(tag)
		if err != nil {
			t.Fatal(err)
		}
		unknown = append(unknown, id)
	}
	unknown = append(unknown, "abc", idA+"0", idA[:19], strings.Repeat("9", 20)+"x", "0")
	for _, id := range unknown {
		if code, body := p.send(t, id); code != http.StatusBadGateway || !strings.Contains(body, "The sandbox was not found") {
			t.Fatalf("unknown sandbox %s: %d %q", id, code, body)
		}
	}
	if a.accepts.Load() != acceptsA || a.relayed.Load() != relayedA || b.accepts.Load() != acceptsB || b.relayed.Load() != relayedB {
		t.Fatalf("unknown sandboxes reached a node: a accepts %d→%d requests %d→%d; b accepts %d→%d requests %d→%d",
			acceptsA, a.accepts.Load(), relayedA, a.relayed.Load(), acceptsB, b.accepts.Load(), relayedB, b.relayed.Load())
	}
	if _, metrics := httpGet(t, p.admin+"/metrics", nil); !strings.Contains(metrics, "skiff_envd_proxy_fleet_nodes 1") {
		t.Errorf("/metrics does not count one fresh node:\n%s", grepLines(metrics, "skiff_envd_proxy_"))
	}
}

func grepLines(s, substr string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
