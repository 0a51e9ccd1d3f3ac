package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/testing/egresstest"
)

// curl runs curl in sandbox id and returns its output, or "FAILED <exit>".
func (h *host) curl(t *testing.T, id, token, args string) string {
	t.Helper()
	got := h.mustRun(id, token, "user", "curl -sk --connect-timeout 2 --max-time 4 "+args+" 2>/dev/null; rc=$?; echo; echo \"exit=$rc\"")
	out := strings.TrimSpace(got.Stdout)
	i := strings.LastIndex(out, "exit=")
	if i < 0 {
		return "FAILED ?"
	}
	if code := out[i+5:]; code != "0" {
		return "FAILED " + code
	}
	return strings.TrimSpace(out[:i])
}

// TestEgressRules: e2b's allowOut and denyOut, on both runtimes, against
// servers and a DNS server in namespaces of the test (never an outside
// address): an allowed and a denied address, an allowed name over TLS and
// HTTP (decided by its SNI and Host, dialled by the host's resolution of
// it, so /etc/hosts cannot lead it elsewhere), a refused name that never
// reaches the DNS server, a wildcard, allow over deny, the operator's
// denied ranges under every rule, and UpdateNetwork changing the rules
// while a connection stays open.
func TestEgressRules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the base template")
	}
	for _, rt := range []string{"native", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			w := egresstest.NewWorld(t)
			testEgressRules(t, baseHost(t, rt, "--allow-cidr", w.Subnet.String(), "--resolv-conf", w.ResolvConf), w)
		})
	}
}

func testEgressRules(t *testing.T, h *host, w *egresstest.World) {
	ctx := context.Background()
	web1, web2, far := w.Web1.Addr, w.Web2.Addr, w.Far.Addr
	withRules := func(allow, deny []string) (string, string) {
		c := h.create(func(r *sandboxdv1.CreateRequest) { r.Egress = &sandboxdv1.Egress{AllowOut: allow, DenyOut: deny} })
		return c.GetSandbox().GetId(), c.GetEnvdAccessToken()
	}
	expect := func(id, tok, what, args, want string) {
		t.Helper()
		got := h.curl(t, id, tok, args)
		if want == "FAILED" && !strings.HasPrefix(got, "FAILED") || want != "FAILED" && !strings.HasPrefix(got, want) {
			t.Errorf("%s: curl %s = %q, want %q", what, args, got, want)
		}
	}

	// No rules: every allowed destination, none the operator denies.
	id, tok := withRules(nil, nil)
	expect(id, tok, "no rules", "http://"+web2+"/", "web2")
	expect(id, tok, "no rules", "http://"+far+"/", "FAILED")

	// An allowed address among all denied; allow wins over deny.
	id, tok = withRules([]string{web1}, []string{"0.0.0.0/0", web1})
	expect(id, tok, "allowed address", "http://"+web1+"/", "web1")
	expect(id, tok, "allowed address over TLS", "https://"+web1+"/", "web1")
	expect(id, tok, "a denied address", "http://"+web2+"/", "FAILED")
	// A denied address alone.
	id, tok = withRules(nil, []string{web2})
	expect(id, tok, "denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "the rest", "http://"+web1+"/", "web1")
	expect(id, tok, "the rest, by name (the resolvers answer a sandbox with rules)", "http://allowed.test/", "web1")

	// Names: allowed over TLS and HTTP, refused, and a wildcard.
	id, tok = withRules([]string{"allowed.test", "*.wild.test"}, []string{"0.0.0.0/0"})
	expect(id, tok, "allowed name, TLS", "https://allowed.test/", "web1 host=allowed.test sni=allowed.test")
	expect(id, tok, "allowed name, HTTP", "http://allowed.test/", "web1 host=allowed.test")
	expect(id, tok, "wildcard", "https://a.wild.test/", "web1 host=a.wild.test")
	expect(id, tok, "wildcard, deeper", "https://b.c.wild.test/", "web1")
	expect(id, tok, "the wildcard's apex", "https://wild.test/", "FAILED")
	expect(id, tok, "a refused name", "https://other.test/", "FAILED")
	if w.Asked("other.test") || w.Asked("wild.test") {
		t.Error("a refused name reached the DNS server: DNS could carry what the rules refuse")
	}
	if !w.Asked("allowed.test") {
		t.Error("the allowed name was never asked of the host's resolver")
	}
	// The sandbox's own idea of a name's address does not lead it
	// elsewhere: the host resolves the allowed name.
	expect(id, tok, "an allowed name pinned to another address", "--resolve allowed.test:443:"+web2+" https://allowed.test/", "web1")
	// A refused name at an address the rules deny, and an address with
	// no name.
	expect(id, tok, "a refused name pinned", "--resolve other.test:443:"+web2+" https://other.test/", "FAILED")
	expect(id, tok, "an address without a name", "https://"+web1+"/", "FAILED")

	// The operator's denied ranges stay under every rule.
	id, tok = withRules([]string{"10.0.0.0/8"}, []string{"0.0.0.0/0"})
	expect(id, tok, "allowOut of 10/8, operator-denied address", "http://"+far+"/", "FAILED")
	expect(id, tok, "allowOut of 10/8, operator-allowed address", "http://"+web1+"/", "web1")

	// UpdateNetwork while a connection is open: the stream goes on, new
	// connections follow the new rules; omitted rules clear.
	id, tok = withRules(nil, nil)
	h.mustRun(id, tok, "user", "setsid curl -sN http://"+web2+"/stream > /tmp/stream 2>/dev/null < /dev/null &")
	grows := func() bool {
		before := h.mustRun(id, tok, "user", "wc -l < /tmp/stream").Stdout
		time.Sleep(400 * time.Millisecond)
		return h.mustRun(id, tok, "user", "wc -l < /tmp/stream").Stdout != before
	}
	waitFor(t, 10*time.Second, "the stream to start", grows)
	update := func(allow, deny []string) {
		t.Helper()
		if _, err := h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{
			SandboxId: id, Team: "team-a", Egress: &sandboxdv1.Egress{AllowOut: allow, DenyOut: deny},
		})); err != nil {
			t.Fatalf("update network: %v", err)
		}
	}
	update([]string{web1}, []string{"0.0.0.0/0"})
	expect(id, tok, "after the update, a denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "after the update, the allowed one", "http://"+web1+"/", "web1")
	if !grows() {
		t.Error("the open connection was cut by the update")
	}
	update(nil, nil)
	expect(id, tok, "after clearing", "http://"+web2+"/", "web2")
	// Internet access off, as e2b's allow_internet_access: all denied but
	// what allowOut allows; and on again.
	internet := func(on bool, allow []string) {
		t.Helper()
		if _, err := h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{
			SandboxId: id, Team: "team-a", Egress: &sandboxdv1.Egress{AllowOut: allow}, AllowInternetAccess: &on,
		})); err != nil {
			t.Fatalf("update network: %v", err)
		}
	}
	internet(false, []string{web1})
	expect(id, tok, "internet off, allowed", "http://"+web1+"/", "web1")
	expect(id, tok, "internet off", "http://"+web2+"/", "FAILED")
	internet(false, nil)
	expect(id, tok, "internet off, nothing allowed", "http://"+web1+"/", "FAILED")
	internet(true, nil)
	expect(id, tok, "internet on again", "http://"+web2+"/", "web2")
	got, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
	if err != nil || len(got.Msg.GetSandbox().GetEgress().GetAllowOut()) != 0 {
		t.Errorf("after clearing, the record: %v %v", got, err)
	}
	// Another team's sandbox, and a bad rule.
	if _, err := h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{SandboxId: id, Team: "team-b"})); code(err) != connect.CodeNotFound {
		t.Errorf("team-b's update: %v", err)
	}
	_, err = h.api.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{SandboxId: id, Team: "team-a", Egress: &sandboxdv1.Egress{DenyOut: []string{"example.com"}}}))
	if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "invalid denied CIDR example.com") {
		t.Errorf("a bad rule: %v", err)
	}

	// The rules survive a pause and kill -9 of sandboxd.
	id, tok = withRules([]string{web1}, []string{"0.0.0.0/0"})
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	expect(id, tok, "after a pause, a denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "after a pause, the allowed one", "http://"+web1+"/", "web1")
	// A fork has its source's rules.
	fork, err := h.api.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{SandboxId: id, Team: "team-a", Count: 1, Timeout: durationpb.New(time.Minute)}))
	if err != nil || len(fork.Msg.GetForks()) != 1 || fork.Msg.GetForks()[0].GetCreated() == nil {
		t.Fatalf("fork: %v %v", fork, err)
	}
	f := fork.Msg.GetForks()[0].GetCreated()
	expect(f.GetSandbox().GetId(), f.GetEnvdAccessToken(), "a fork, a denied address", "http://"+web2+"/", "FAILED")
	expect(f.GetSandbox().GetId(), f.GetEnvdAccessToken(), "a fork, the allowed one", "http://"+web1+"/", "web1")
	h.kill9()
	h.start()
	expect(id, tok, "after kill -9, a denied address", "http://"+web2+"/", "FAILED")
	expect(id, tok, "after kill -9, the allowed one", "http://"+web1+"/", "web1")
}
