package service

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// A sandbox's outbound rules: checked at create with e2b's messages, given
// to the network when they can refuse something, returned by Get, replaced
// by UpdateNetwork (not for another team's sandbox or a paused one).
func TestOutboundRules(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	ctx := t.Context()

	_, err := h.client.Create(ctx, createReq(func(r *pb.CreateRequest) {
		r.Egress = &pb.Egress{AllowOut: []string{"example.com"}}
	}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "must include 'ALL_TRAFFIC' in deny out") {
		t.Errorf("a domain without a deny of all: %v", err)
	}
	_, err = h.client.Create(ctx, createReq(func(r *pb.CreateRequest) { r.MaskRequestHost = strings.Repeat("a", 256) }))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a long maskRequestHost: %v", err)
	}

	// No rules: nothing for the network but internet access.
	plain := h.create().GetSandbox().GetId()
	if _, ok := h.net.Policy(plain); ok {
		t.Error("a sandbox without rules got rules")
	}

	c := h.create(func(r *pb.CreateRequest) {
		r.Egress = &pb.Egress{AllowOut: []string{"1.1.1.1", "*.example.com"}, DenyOut: []string{"0.0.0.0/0"}}
		r.MaskRequestHost = "custom.example.com:${PORT}"
	})
	id := c.GetSandbox().GetId()
	r, ok := h.net.Policy(id)
	if !ok || !r.DeniesAll() || !r.AllowsName("a.example.com") || r.AllowsName("example.com") {
		t.Errorf("the network's rules: %+v, %v", r, ok)
	}
	sb, err := h.get(id)
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.GetEgress(); strings.Join(got.GetAllowOut(), ",") != "1.1.1.1,*.example.com" || strings.Join(got.GetDenyOut(), ",") != "0.0.0.0/0" || sb.GetMaskRequestHost() != "custom.example.com:${PORT}" {
		t.Errorf("Get: egress %v, mask %q", got, sb.GetMaskRequestHost())
	}

	update := func(id, team string, e *pb.Egress, internet *bool) error {
		_, err := h.client.UpdateNetwork(ctx, connect.NewRequest(&pb.UpdateNetworkRequest{SandboxId: id, Team: team, Egress: e, AllowInternetAccess: internet}))
		return err
	}
	if err := update(id, "team-a", &pb.Egress{DenyOut: []string{"8.8.8.8"}}, nil); err != nil {
		t.Fatal(err)
	}
	if r, _ := h.net.Policy(id); r.DeniesAll() || len(r.DenyCIDRs) != 1 || r.HasDomains() {
		t.Errorf("after the update, the network's rules: %+v", r)
	}
	off := false
	if err := update(id, "team-a", nil, &off); err != nil {
		t.Fatal(err)
	}
	if r, _ := h.net.Policy(id); !r.DeniesAll() {
		t.Errorf("internet access off: %+v, want a deny of all", r)
	}
	if sb, _ := h.get(id); sb.GetAllowInternetAccess() || len(sb.GetEgress().GetDenyOut()) != 0 {
		t.Errorf("internet access off, the record: %v", sb)
	}
	on := true
	if err := update(id, "team-a", &pb.Egress{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}, &on); err != nil {
		t.Fatal(err)
	}
	if err := update(id, "team-b", nil, nil); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("another team's update: %v", err)
	}
	if err := update(id, "team-a", &pb.Egress{DenyOut: []string{"0.0.0.0"}}, nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("an unspecified address: %v", err)
	}
	if err := update("unknown0000000000000", "team-a", nil, nil); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an unknown sandbox: %v", err)
	}

	// A paused sandbox is not among the running: 404, as e2b.
	if _, err := h.client.Pause(ctx, connect.NewRequest(&pb.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if err := update(id, "team-a", nil, nil); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a paused sandbox's update: %v", err)
	}
}

// The egress filters know a sandbox whose rules restrict something until
// it ends: rules that stop restricting keep it known (what the proxy
// relays for it goes on), a kill forgets it, and so does a create undone
// after its network was set up.
func TestEgressForgottenWhenTheSandboxEnds(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	restricted := func(m *pb.CreateRequest) { m.Egress = &pb.Egress{DenyOut: []string{"0.0.0.0/0"}} }
	id := h.create(restricted).GetSandbox().GetId()
	if h.egress.Len() != 1 {
		t.Fatalf("a restricted sandbox: the filters know %d, want 1", h.egress.Len())
	}
	// By its team too, whose sandboxes share the filters' slots.
	rec, err := h.reg.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if team := h.egress.Team(netip.MustParseAddr(rec.Address)); team != "team-a" {
		t.Fatalf("the filters know the sandbox as team %q's, want team-a's", team)
	}
	if _, err := h.client.UpdateNetwork(t.Context(), connect.NewRequest(&pb.UpdateNetworkRequest{SandboxId: id, Team: "team-a", Egress: &pb.Egress{}})); err != nil {
		t.Fatal(err)
	}
	if h.egress.Len() != 1 {
		t.Fatalf("its rules cleared: the filters know %d, want it still", h.egress.Len())
	}
	if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if h.egress.Len() != 0 {
		t.Fatalf("killed: the filters know %d, want none", h.egress.Len())
	}
	h.rt.Configure(func(c *servicetest.RuntimeConfig) { c.StartErr = errors.New("no cgroup") })
	if _, err := h.client.Create(t.Context(), createReq(restricted)); err == nil {
		t.Fatal("the create succeeded")
	}
	if h.egress.Len() != 0 {
		t.Fatalf("a create undone: the filters know %d, want none", h.egress.Len())
	}
}
