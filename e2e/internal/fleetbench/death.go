package fleetbench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// notRouted is in the body of the proxy's 502 for a sandbox on no fresh
// node (routing.WriteSandboxNotFound); its 502 for a routed request whose
// node did not answer says otherwise.
var notRouted = []byte("The sandbox was not found")

// death kills the last host as kill -9 would and measures how long its
// sandboxes take to leave the timed team's e2b list, the aggregated list
// and the proxy's routing: from the kill, and from the host's last publish
// (its inventory's publishedAt, which has whole seconds). The contract:
// between the window and the window plus one interval after the last
// publish.
func (b *bench) death() error {
	hosts := b.fleet.Hosts()
	victim := hosts[len(hosts)-1]
	var id string
	for _, sb := range victim.Sandboxd().Sandboxes() {
		if sb.GetTeam() == b.team {
			id = sb.GetId()
			break
		}
	}
	if id == "" {
		return fmt.Errorf("death: %s has no sandbox of %s", victim.Name(), b.team)
	}
	ctx := b.ctx
	// Each check must see the host first, or its "gone" would mean nothing.
	e2b, kube, proxy := b.deathChecks(ctx, victim.Name(), id)
	for name, gone := range map[string]func() (bool, error){"e2b list": e2b, "kubectl list": kube, "proxy": proxy} {
		g, err := gone()
		if err != nil {
			return fmt.Errorf("death: before the kill, ask the %s for %s: %w", name, victim.Name(), err)
		}
		if g {
			return fmt.Errorf("death: before the kill, the %s does not show %s", name, victim.Name())
		}
	}
	b.say("death: killing %s (its sandboxd and publisher, as kill -9)", victim.Name())
	victim.Kill()
	killed := time.Now()
	var inv v1beta1.NodeInventory
	if err := b.admin.Get(ctx, client.ObjectKey{Name: victim.Name()}, &inv); err != nil {
		return fmt.Errorf("death: the last publish of %s: %w", victim.Name(), err)
	}
	if inv.PublishedAt == nil {
		return fmt.Errorf("death: the inventory of %s has no publishedAt", victim.Name())
	}
	last := inv.PublishedAt.Time

	checks := []struct {
		metric string
		gone   func() (bool, error)
		at     time.Time
	}{{"e2b_list_left", e2b, time.Time{}}, {"kubectl_list_left", kube, time.Time{}}, {"proxy_left", proxy, time.Time{}}}
	bound := b.o.window() + b.o.Interval + time.Minute
	for left := 0; left < len(checks); {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(killed) > bound {
			return fmt.Errorf("death: %s's sandboxes still listed or routed %s after the kill", victim.Name(), bound)
		}
		for i := range checks {
			c := &checks[i]
			if !c.at.IsZero() {
				continue
			}
			if g, err := c.gone(); err == nil && g {
				c.at = time.Now()
				left++
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range checks {
		b.rep.add(PhaseDeath, c.metric+"_after_kill", victim.Name(), c.at.Sub(killed).Seconds(), "s")
		b.rep.add(PhaseDeath, c.metric+"_after_last_publish", victim.Name(), c.at.Sub(last).Seconds(), "s")
	}
	b.say("death: %s's sandboxes left the e2b list, the kubectl list and the proxy %.1fs, %.1fs and %.1fs after its last publish",
		victim.Name(), checks[0].at.Sub(last).Seconds(), checks[1].at.Sub(last).Seconds(), checks[2].at.Sub(last).Seconds())
	return nil
}

// deathChecks return whether node's sandboxes are gone from the timed
// team's e2b list, from the aggregated list, and (by its sandbox id) from
// the proxy's routing: a 502 that routed nowhere, not one from a routed
// request that found the node dead.
func (b *bench) deathChecks(ctx context.Context, node, id string) (e2b, kube, proxy func() (bool, error)) {
	e2b = func() (bool, error) {
		n, err := b.e2bCount(ctx, node)
		return n == 0, err
	}
	kube = func() (bool, error) {
		n, err := b.kubePage(ctx, 1, node)
		return n == 0, err
	}
	proxy = func() (bool, error) {
		code, body, _ := proxyHealth(b.proxyURL, id)
		switch {
		case code == http.StatusNoContent:
			return false, nil
		case code == http.StatusBadGateway && bytes.Contains(body, notRouted):
			return true, nil
		case code == http.StatusBadGateway:
			return false, nil // routed to the dead node
		}
		return false, fmt.Errorf("proxy for %s: %d %s", id, code, body)
	}
	return e2b, kube, proxy
}
