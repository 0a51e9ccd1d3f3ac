package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"connectrpc.com/connect"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// warmCounts returns the warm sandboxes of pool in each host's published
// inventory.
func warmCounts(t *testing.T, c client.Client, pool string) (map[string]int, map[string]bool) {
	t.Helper()
	var l v1beta1.NodeInventoryList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatal(err)
	}
	counts, ids := map[string]int{}, map[string]bool{}
	for _, n := range l.Items {
		for _, e := range n.Spec.Sandboxes {
			if e.State == v1beta1.SandboxWarm && e.Pool == pool {
				counts[n.Name]++
				ids[e.ID] = true
			}
		}
	}
	return counts, ids
}

func TestWarmPools(t *testing.T) {
	var k kubeSystem
	s := newKubeSystemWith(t, kubeSystemOptions{secondHost: true, secondReplica: true, kube: &k, serveArgs: []string{
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s",
		"--warm-pool-interval", "1s",
	}})
	c, ctx := k.env.Client, t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pools"}}); err != nil {
		t.Fatal(err)
	}
	pool := &v1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "pools", Name: "base"},
		Spec:       v1beta1.SandboxWarmPoolSpec{Template: "base", Replicas: new(int32(4))},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// wantPool waits until the pool's status and the hosts' inventories
	// show ready warm sandboxes, and returns their IDs.
	wantPool := func(ready int32) map[string]bool {
		t.Helper()
		var ids map[string]bool
		eventually(t, 90*time.Second, func() string {
			var p v1beta1.SandboxWarmPool
			if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
				return err.Error()
			}
			counts, got := warmCounts(t, c, "pools/base")
			ids = got
			cond := meta.FindStatusCondition(p.Status.Conditions, v1beta1.SandboxWarmPoolConditionReady)
			st := p.Status
			switch {
			case int32(len(got)) != ready:
				return fmt.Sprintf("inventories hold %d warm sandboxes of the pool (%v), want %d", len(got), counts, ready)
			case st.Ready != ready || st.Warming != 0 || st.Replicas != ready || st.ObservedGeneration != p.Generation:
				return fmt.Sprintf("status %+v, want %d ready at generation %d", st, ready, p.Generation)
			case cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != "Filled" || cond.ObservedGeneration != p.Generation:
				return fmt.Sprintf("Ready condition %+v", cond)
			}
			if ready == 4 && (counts["host-k"] != 2 || counts["host-l"] != 2) {
				return fmt.Sprintf("a pool of 4 on two hosts is spread %v, want 2 and 2", counts)
			}
			return ""
		})
		return ids
	}
	warm := wantPool(4)
	// The scale subresource, as an HPA reads it, has the selector the
	// driver sets in the status (without one, an HPA does not scale): the
	// label of the pool's sandboxes.
	scale := &autoscalingv1.Scale{}
	if err := c.SubResource("scale").Get(ctx, pool, scale); err != nil {
		t.Fatal(err)
	}
	if want := sbv1.PoolLabel + "=base"; scale.Status.Selector != want || scale.Status.Replicas != 4 || scale.Spec.Replicas != 4 {
		t.Errorf("the pool's scale %+v, want 4 replicas and the selector %s", scale, want)
	}
	// Exactly one of the two replicas holds the lease and drives the pool.
	const leader = "skiff_apiserver_warm_pool_leader"
	leaders := func() string { return hosttest.Metric(k.admin, leader) + hosttest.Metric(k.replica2Admin, leader) }
	eventually(t, 30*time.Second, func() string {
		if l := leaders(); l != "10" && l != "01" {
			return "warm_pool_leader of the two replicas: " + l + ", want one 1 and one 0"
		}
		return ""
	})

	// Two creates through the e2b API claim two of them, with the create's
	// metadata; the pool refills to 4.
	for range 2 {
		id := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 120, "metadata": map[string]string{"who": "claim"}})
		if !warm[id] {
			t.Errorf("create gave %s, not one of the warm sandboxes %v", id, warm)
		}
		code, body := s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil)
		if code != http.StatusOK || !strings.Contains(string(body), `"who":"claim"`) {
			t.Errorf("claimed sandbox: %d %s", code, body)
		}
	}
	wantPool(4)

	// kubectl scale trims it to 1.
	if out, err := kubectl(t, k.env.Kubeconfig(t), "scale", "sandboxwarmpool/base", "-n", "pools", "--replicas=1"); err != nil {
		t.Fatalf("kubectl scale: %v %s", err, out)
	}
	one := wantPool(1)

	// The kube-apiserver goes away for longer than the lease: the driver
	// steps down; the e2b API keeps listing, creating and claiming from
	// its cache; the process does not exit.
	k.env.StopAPIServer(t)
	eventually(t, 30*time.Second, func() string {
		if l := leaders(); l != "00" {
			return "warm_pool_leader of the two replicas with the kube-apiserver down: " + l + ", want 0 and 0"
		}
		return ""
	})
	time.Sleep(5 * time.Second) // past the lease duration
	if code, body := s.call(s.keyA, http.MethodGet, "/v2/sandboxes", nil); code != http.StatusOK {
		t.Errorf("e2b list during the outage: %d %s", code, body)
	}
	claimed := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 120})
	if !one[claimed] {
		t.Errorf("the create during the outage gave %s, not the pool's warm sandbox %v", claimed, one)
	}
	cold := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 120})
	if claimed == cold {
		t.Errorf("two creates gave one sandbox %s", cold)
	}
	if !k.daemon.Running() {
		t.Fatal("sandbox-apiserver exited when the kube-apiserver went away")
	}

	// The control plane returns: the driver leads again and refills the
	// pool the outage's claim emptied.
	k.env.StartAPIServer(t)
	eventually(t, 60*time.Second, func() string {
		if l := leaders(); l != "10" && l != "01" {
			return "warm_pool_leader of the two replicas after the kube-apiserver returned: " + l + ", want one 1"
		}
		return ""
	})
	eventually(t, 60*time.Second, func() string {
		if _, ids := warmCounts(t, c, "pools/base"); ids[claimed] || len(ids) != 1 {
			return fmt.Sprintf("warm sandboxes %v: want one, not %s, claimed during the outage", ids, claimed)
		}
		return ""
	})
	wantPool(1)
	if !k.daemon.Running() || !k.replica2.Running() {
		t.Fatal("a sandbox-apiserver replica exited")
	}

	// The leader shuts down: it releases the lease, the other replica takes
	// it at once and refills what a claim through it takes.
	leading, other, otherAdmin, otherAPI := k.daemon, k.replica2, k.replica2Admin, k.replica2API
	if leaders() == "01" {
		leading, other, otherAdmin, otherAPI = k.replica2, k.daemon, k.admin, s.api
	}
	leading.Stop()
	eventually(t, 30*time.Second, func() string {
		if v := hosttest.Metric(otherAdmin, leader); v != "1" {
			return "the other replica does not lead after the leader stopped: " + v
		}
		return ""
	})
	if !other.Running() {
		t.Fatal("the other replica exited")
	}
	s.api = otherAPI
	taken := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 120})
	eventually(t, 60*time.Second, func() string {
		if _, ids := warmCounts(t, c, "pools/base"); ids[taken] || len(ids) != 1 {
			return fmt.Sprintf("warm sandboxes %v after a claim of %s through the second replica, want one other", ids, taken)
		}
		return ""
	})
}

// Single-host mode keeps --warm-pool's pools warm: a create claims one,
// and the pool refills.
func TestWarmPoolSingleHost(t *testing.T) {
	s := newSystemWith(t, "--warm-pool", "base=2", "--warm-pool-interval", "500ms")
	warmOnHost := func() map[string]bool { return s.warmIDs(t, "default/base") }
	var warm map[string]bool
	eventually(t, 60*time.Second, func() string {
		if warm = warmOnHost(); len(warm) != 2 {
			return fmt.Sprintf("the host has %d warm sandboxes of default/base, want 2", len(warm))
		}
		return ""
	})
	id := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 60})
	if !warm[id] {
		t.Errorf("create gave %s, not one of the warm %v", id, warm)
	}
	eventually(t, 60*time.Second, func() string {
		if now := warmOnHost(); len(now) != 2 || now[id] {
			return fmt.Sprintf("after a claim the host has warm %v, want 2 others than %s", now, id)
		}
		return ""
	})
}

// warmIDs returns the warm sandboxes of pool on the system's host, as its
// sandboxd lists them.
func (s *system) warmIDs(tb testing.TB, pool string) map[string]bool {
	tb.Helper()
	resp, err := sandboxdapi.NewClients(s.token, nil)(s.sandboxd).List(tb.Context(),
		connect.NewRequest(&sandboxdv1.ListRequest{States: []sandboxdv1.SandboxState{sandboxdv1.SandboxState_SANDBOX_STATE_WARM}}))
	if err != nil {
		tb.Fatal(err)
	}
	ids := map[string]bool{}
	for _, sb := range resp.Msg.GetSandboxes() {
		if sb.GetPool() == pool {
			ids[sb.GetId()] = true
		}
	}
	return ids
}
