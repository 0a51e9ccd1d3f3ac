package fleet_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

func privateParams(template string) e2bapi.CreateParams {
	p := params(template)
	p.AutoResume = true
	p.AllowPublicTraffic = new(false)
	return p
}

// Private traffic and auto-resume reach the host on cold creates and warm
// claims; the traffic token comes back from create and connect, never from
// Get; Get says what the sandbox has.
func TestCreatePrivateAutoResume(t *testing.T) {
	for _, warm := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(t *testing.T) {
			a := newFakeNode("node-a", "base")
			var warmID string
			if warm {
				warmID = a.addWarm(t, "base")
			}
			h := newHarness(t, a)
			sb, err := h.b.Create(t.Context(), "team1", privateParams("base"))
			if err != nil {
				t.Fatal(err)
			}
			if warm != (sb.ID == warmID) || warm == slices.Contains(a.calls, "Create") {
				t.Fatalf("created %s (warm %s) after %v", sb.ID, warmID, a.calls)
			}
			if sb.TrafficAccessToken != "traffic-"+sb.ID || !sb.AutoResume || sb.AllowPublicTraffic == nil || *sb.AllowPublicTraffic {
				t.Fatalf("Create = %+v; want the traffic token, auto-resume, private", sb)
			}
			got, err := h.b.Get(t.Context(), "team1", sb.ID)
			if err != nil || got.TrafficAccessToken != "" || !got.AutoResume || got.AllowPublicTraffic == nil || *got.AllowPublicTraffic {
				t.Fatalf("Get = %+v, %v; want auto-resume, private, no token", got, err)
			}
			if err := h.b.Pause(t.Context(), "team1", sb.ID, true); err != nil {
				t.Fatal(err)
			}
			got, resumed, err := h.b.Connect(t.Context(), "team1", sb.ID, time.Minute, false)
			if err != nil || !resumed || got.TrafficAccessToken != sb.TrafficAccessToken {
				t.Fatalf("Connect = %+v, %v, %v; want resumed with the traffic token", got, resumed, err)
			}
			got, resumed, err = h.b.Connect(t.Context(), "team1", sb.ID, time.Minute, false)
			if err != nil || resumed || got.TrafficAccessToken != sb.TrafficAccessToken {
				t.Fatalf("Connect to running = %+v, %v, %v; want the traffic token", got, resumed, err)
			}
		})
	}

	// A public create has neither.
	h := newHarness(t, newFakeNode("node-a", "base"))
	sb, err := h.b.Create(t.Context(), "team1", params("base"))
	if err != nil || sb.TrafficAccessToken != "" || sb.AutoResume || sb.AllowPublicTraffic == nil || !*sb.AllowPublicTraffic {
		t.Fatalf("public Create = %+v, %v", sb, err)
	}
}

// A host whose sandboxd predates private traffic ignores it: the sandbox it
// started is killed and the create goes to a host that knows it, or fails.
func TestCreatePrivateOnOldHost(t *testing.T) {
	old, current := newFakeNode("node-a", "base"), newFakeNode("node-b", "py")
	old.old = true
	h := newHarness(t, old, current)
	_, err := h.b.Create(t.Context(), "team1", privateParams("base"))
	if !errors.Is(err, e2bapi.ErrCapacity) {
		t.Fatalf("Create on an old host only = %v, want ErrCapacity", err)
	}
	if !slices.Contains(old.calls, "Kill") || len(old.sandboxes) != 0 {
		t.Fatalf("the old host's sandbox was not killed: calls %v, sandboxes %d", old.calls, len(old.sandboxes))
	}
	// A public create there is fine.
	if _, err := h.b.Create(t.Context(), "team1", params("base")); err != nil {
		t.Fatal(err)
	}

	// A warm sandbox on the old host is claimed, killed, and the create
	// falls back to a cold one on a current host.
	current.templates = append(current.templates, "base")
	h.publish(current)
	warm := old.addWarm(t, "base")
	h.publish(old)
	sb, err := h.b.Create(t.Context(), "team1", privateParams("base"))
	if err != nil || sb.Node != "node-b" || sb.TrafficAccessToken == "" {
		t.Fatalf("Create = %+v, %v; want a private sandbox on node-b", sb, err)
	}
	if _, ok := old.sandboxes[warm]; ok {
		t.Fatal("the warm sandbox the old host claimed without private traffic is alive")
	}
}

// Outbound rules and maskRequestHost: a create with them is always cold
// (warm sandboxes have neither) and reaches the host with them; Get says
// them; UpdateNetwork replaces them on the sandbox's host, not for another
// team or a paused sandbox; a host too old to know them has its sandbox
// killed.
func TestOutboundRules(t *testing.T) {
	a := newFakeNode("node-a", "base")
	a.addWarm(t, "base")
	h := newHarness(t, a)
	p := params("base")
	p.AllowOut, p.DenyOut, p.MaskRequestHost = []string{"1.1.1.1"}, []string{"0.0.0.0/0"}, "custom.example.com:${PORT}"
	sb, err := h.b.Create(t.Context(), "team1", p)
	if err != nil || slices.Contains(a.calls, "Claim") {
		t.Fatalf("Create = %+v, %v after %v; want a cold sandbox", sb, err, a.calls)
	}
	got, err := h.b.Get(t.Context(), "team1", sb.ID)
	if err != nil || !slices.Equal(got.AllowOut, p.AllowOut) || !slices.Equal(got.DenyOut, p.DenyOut) || got.MaskRequestHost != p.MaskRequestHost {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	off := false
	if err := h.b.UpdateNetwork(t.Context(), "team1", sb.ID, e2bapi.NetworkUpdate{DenyOut: []string{"8.8.8.8"}, AllowInternetAccess: &off}); err != nil {
		t.Fatal(err)
	}
	if e := a.sandboxes[sb.ID].GetEgress(); e.GetAllowOut() != nil || !slices.Equal(e.GetDenyOut(), []string{"8.8.8.8"}) || a.sandboxes[sb.ID].GetAllowInternetAccess() {
		t.Errorf("the host's sandbox after the update: %v", a.sandboxes[sb.ID])
	}
	if err := h.b.UpdateNetwork(t.Context(), "team2", sb.ID, e2bapi.NetworkUpdate{}); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("another team's update: %v", err)
	}
	if err := h.b.Pause(t.Context(), "team1", sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := h.b.UpdateNetwork(t.Context(), "team1", sb.ID, e2bapi.NetworkUpdate{}); !errors.Is(err, e2bapi.ErrNotFound) {
		t.Errorf("a paused sandbox's update: %v", err)
	}

	old := newFakeNode("node-b", "base")
	old.old = true
	h = newHarness(t, old)
	if _, err := h.b.Create(t.Context(), "team1", p); !errors.Is(err, e2bapi.ErrCapacity) || !slices.Contains(old.calls, "Kill") {
		t.Fatalf("Create with rules on an old host = %v after %v; want its sandbox killed", err, old.calls)
	}
}
