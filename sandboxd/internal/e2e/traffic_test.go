package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/relay"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/wire"
)

// userPort is where the tests' web server listens inside a sandbox.
const userPort = 8080

// startWebServer runs busybox httpd on userPort in sandbox id (as user,
// through envd): / answers "hello", /cgi-bin/token the traffic token header
// the sandbox received.
func (h *host) startWebServer(id, envdToken string) {
	h.t.Helper()
	h.mustRun(id, envdToken, "user", `mkdir -p /tmp/www/cgi-bin && echo hello > /tmp/www/index.html &&
printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\necho "token=[$HTTP_E2B_TRAFFIC_ACCESS_TOKEN]"\n' > /tmp/www/cgi-bin/token &&
chmod +x /tmp/www/cgi-bin/token && httpd -p `+strconv.Itoa(userPort)+` -h /tmp/www`)
}

// relayGet sends GET path for port of sandbox id through sandboxd's relay,
// with the node token and the given headers.
func (h *host) relayGet(id string, port int, path string, headers map[string]string) (int, string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.listen+path, http.NoBody)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	req.Header.Set(wire.NodeTokenHeader, h.token)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		h.t.Fatalf("relay GET %s to %s:%d: %v", path, id, port, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (h *host) get(id string) *sandboxdv1.GetResponse {
	h.t.Helper()
	resp, err := h.api.Get(context.Background(), connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
	if err != nil {
		h.t.Fatalf("get %s: %v", id, err)
	}
	return resp.Msg
}

func (h *host) pause(id string) {
	h.t.Helper()
	if _, err := h.api.Pause(context.Background(), connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id})); err != nil {
		h.t.Fatalf("pause %s: %v", id, err)
	}
}

// TestPrivateTraffic: a sandbox with public traffic off serves its web
// server only to requests with its traffic token (none or a wrong one: 403, as e2b),
// which never reaches the server; its envd needs no traffic token; a public
// sandbox's server answers without one.
func TestPrivateTraffic(t *testing.T) {
	h := newHost(t)
	priv := h.create(func(r *sandboxdv1.CreateRequest) { r.AllowPublicTraffic = new(false) })
	pub := h.create(nil)
	privID, tok := priv.GetSandbox().GetId(), priv.GetTrafficAccessToken()
	if len(tok) != 64 || priv.GetSandbox().GetAllowPublicTraffic() || pub.GetTrafficAccessToken() != "" || !pub.GetSandbox().GetAllowPublicTraffic() {
		t.Fatalf("private %v (token %q), public %v (token %q)", priv.GetSandbox(), tok, pub.GetSandbox(), pub.GetTrafficAccessToken())
	}
	if got := h.get(privID).GetTrafficAccessToken(); got != tok {
		t.Fatalf("Get's traffic token = %q, want the create's", got)
	}
	// envd's port is not affected: this runs through the relay without it.
	h.startWebServer(privID, priv.GetEnvdAccessToken())
	h.startWebServer(pub.GetSandbox().GetId(), pub.GetEnvdAccessToken())

	for _, tc := range []struct {
		name, id, path string
		headers        map[string]string
		status         int
		body           string
	}{
		{"private, no token", privID, "/", nil, 403, `"code":403`},
		{"private, wrong token", privID, "/", map[string]string{relay.TrafficTokenHeader: strings.Repeat("0", 64)}, 403, `"code":403`},
		{"private, right token", privID, "/", map[string]string{"e2b-traffic-access-token": tok}, 200, "hello\n"},
		{"private, the token does not reach the sandbox", privID, "/cgi-bin/token", map[string]string{relay.TrafficTokenHeader: tok}, 200, "token=[]\n"},
		{"public, no token", pub.GetSandbox().GetId(), "/", nil, 200, "hello\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := h.relayGet(tc.id, userPort, tc.path, tc.headers)
			if status != tc.status || (status == 200 && body != tc.body) || !strings.Contains(body, tc.body) {
				t.Fatalf("= %d %q, want %d %q", status, body, tc.status, tc.body)
			}
		})
	}
	if status, _ := h.relayGet(privID, 49983, "/health", nil); status/100 != 2 {
		t.Errorf("envd /health of the private sandbox without a traffic token: %d", status)
	}
}

// TestAutoResume: a paused sandbox created with auto-resume is resumed by a
// request for its envd that carries its access token (a health check or a
// request without the token leaves it asleep), which envd then answers;
// its deadline moves to now + its last timeout. A paused sandbox without auto-resume answers 502. After
// kill -9 of sandboxd, a paused private sandbox keeps its traffic token and
// auto-resume.
func TestAutoResume(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	auto := h.create(func(r *sandboxdv1.CreateRequest) { r.AutoResume = true })
	manual := h.create(nil)
	autoID, manualID := auto.GetSandbox().GetId(), manual.GetSandbox().GetId()
	if !auto.GetSandbox().GetAutoResume() || manual.GetSandbox().GetAutoResume() {
		t.Fatalf("auto_resume: %v / %v", auto.GetSandbox(), manual.GetSandbox())
	}
	h.mustRun(autoID, auto.GetEnvdAccessToken(), "user", "echo kept > /tmp/state")
	// Its last timeout becomes 10 minutes.
	if _, err := h.api.SetTimeout(ctx, connect.NewRequest(&sandboxdv1.SetTimeoutRequest{SandboxId: autoID, Timeout: durationpb.New(10 * time.Minute)})); err != nil {
		t.Fatal(err)
	}
	h.pause(autoID)
	h.pause(manualID)

	if status, body := h.relayGet(manualID, 49983, "/health", nil); status != http.StatusBadGateway || !strings.Contains(body, "not found") {
		t.Errorf("paused sandbox without auto-resume: %d %q", status, body)
	}
	if st := h.get(manualID).GetSandbox().GetState(); st != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("the sandbox without auto-resume is %s", st)
	}

	// Only a request with the sandbox's access token wakes it: without
	// it, a health check or any other request gets e2b's 403.
	for _, probe := range []struct {
		path    string
		headers map[string]string
	}{{"/health", nil}, {"/envs", nil}, {"/envs", map[string]string{"X-Access-Token": "made-up"}}} {
		if status, body := h.relayGet(autoID, 49983, probe.path, probe.headers); status != http.StatusForbidden || !strings.Contains(body, "can't be resumed with the credentials provided") {
			t.Errorf("%s %v to the paused sandbox with auto-resume: %d %s, want e2b's 403", probe.path, probe.headers, status, body)
		}
	}
	if st := h.get(autoID).GetSandbox().GetState(); st != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("a request without the access token woke the sandbox: %s", st)
	}
	before := time.Now()
	status, _ := h.relayGet(autoID, 49983, "/envs", map[string]string{"X-Access-Token": auto.GetEnvdAccessToken()})
	after := time.Now()
	if status/100 != 2 {
		t.Fatalf("envd /envs of the auto-resumed sandbox: %d\n%s", status, h.logTail())
	}
	sb := h.get(autoID).GetSandbox()
	end := sb.GetEndAt().AsTime()
	if sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING || end.Before(before.Add(10*time.Minute)) || end.After(after.Add(10*time.Minute)) {
		t.Fatalf("after auto-resume: %s until %v; want running until 10 minutes after the request (%v … %v)",
			sb.GetState(), end, before.Add(10*time.Minute), after.Add(10*time.Minute))
	}
	if got := h.mustRun(autoID, auto.GetEnvdAccessToken(), "user", "cat /tmp/state"); got.Stdout != "kept\n" {
		t.Errorf("after auto-resume: %+v", got)
	}

	// kill -9 keeps a paused private sandbox's token and auto-resume.
	priv := h.create(func(r *sandboxdv1.CreateRequest) { r.AutoResume = true; r.AllowPublicTraffic = new(false) })
	privID, tok := priv.GetSandbox().GetId(), priv.GetTrafficAccessToken()
	h.startWebServer(privID, priv.GetEnvdAccessToken())
	h.pause(privID)
	h.kill9()
	h.start()
	got := h.get(privID)
	if got.GetTrafficAccessToken() != tok || !got.GetSandbox().GetAutoResume() || got.GetSandbox().GetAllowPublicTraffic() ||
		got.GetSandbox().GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Fatalf("re-adopted as %v (token kept: %v)", got.GetSandbox(), got.GetTrafficAccessToken() == tok)
	}
	if status, _ := h.relayGet(privID, userPort, "/", nil); status != http.StatusForbidden {
		t.Errorf("re-adopted private sandbox without a token: %d", status)
	}
	if st := h.get(privID).GetSandbox().GetState(); st != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("a request without the token woke the sandbox: %s", st)
	}
	if status, body := h.relayGet(privID, userPort, "/", map[string]string{relay.TrafficTokenHeader: tok}); status != http.StatusOK || body != "hello\n" {
		t.Errorf("re-adopted private sandbox with its token (auto-resumed): %d %q", status, body)
	}
	if st := h.get(privID).GetSandbox().GetState(); st != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("after its auto-resume the re-adopted sandbox is %s", st)
	}
}
