package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// apiErr decodes e2b's error shape, failing the test on anything else.
func apiErr(t *testing.T, body string) wire.Error {
	t.Helper()
	var e wire.Error
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("body %q is not e2b's error JSON: %v", body, err)
	}
	return e
}

func TestForwardsHeadersAndNormalizesRouting(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")

	req := h.request(http.MethodPost, "/filesystem.Filesystem/ListDir?x=1&y=%2F", "", "", strings.NewReader(`{"path":"/"}`))
	req.Header["E2b-Sandbox-Id"] = []string{id}
	req.Header["E2b-Sandbox-Port"] = []string{"49983"}
	req.Header.Set("X-Access-Token", "access-token-1")
	req.Header.Set("Authorization", "Basic dXNlcjo=")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	req.Header.Set("Tracestate", "rojo=00f067aa0ba902b7")
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("X-Custom", "kept")
	req.Header.Set("User-Agent", "e2b-js-sdk/2.51.0")
	resp, body := h.do(req)
	if resp.StatusCode != http.StatusOK || body != "ok from node-a" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	h.waitCounted("header", "200", 1)
	if to, from := testutil.ToFloat64(h.proxy.metrics.toSandbox), testutil.ToFloat64(h.proxy.metrics.fromSandbox); to < 100 || from < 100 {
		t.Errorf("bytes_total to_sandbox %v from_sandbox %v", to, from)
	}
	got := a.last(t)
	want := map[string]string{
		"E2b-Sandbox-Id":           id,
		"E2b-Sandbox-Port":         "49983",
		"Skiff-Node-Token":         nodeToken,
		"X-Access-Token":           "access-token-1",
		"Authorization":            "Basic dXNlcjo=",
		"Content-Type":             "application/json",
		"Connect-Protocol-Version": "1",
		"Traceparent":              "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"Tracestate":               "rojo=00f067aa0ba902b7",
		"X-Custom":                 "kept",
		"User-Agent":               "e2b-js-sdk/2.51.0",
		"X-Forwarded-For":          "203.0.113.7, 127.0.0.1",
	}
	for k, v := range want {
		if vals := got.Header.Values(k); len(vals) != 1 || vals[0] != v {
			t.Errorf("sandboxd got %s = %q, want [%q]", k, vals, v)
		}
	}
	if got.URL.Path != "/filesystem.Filesystem/ListDir" || got.URL.RawQuery != "x=1&y=%2F" || got.Method != http.MethodPost {
		t.Errorf("sandboxd got %s %s?%s", got.Method, got.URL.Path, got.URL.RawQuery)
	}
	if got.Host != strings.TrimPrefix(h.srv.URL, "http://") {
		t.Errorf("sandboxd got Host %q, want the client's", got.Host)
	}

	// A host-routed request reaches sandboxd with the routing headers set
	// from the host.
	req = h.request(http.MethodGet, "/", "", "", nil)
	req.Host = "8080-" + id + ".sandbox.example.com"
	if resp, _ := h.do(req); resp.StatusCode != http.StatusOK {
		t.Fatalf("host-routed: %d", resp.StatusCode)
	}
	got = a.last(t)
	if got.Header.Get("E2b-Sandbox-Id") != id || got.Header.Get("E2b-Sandbox-Port") != "8080" || got.Host != req.Host {
		t.Errorf("host-routed request reached sandboxd with id %q port %q host %q",
			got.Header.Get("E2b-Sandbox-Id"), got.Header.Get("E2b-Sandbox-Port"), got.Host)
	}
}

func TestNodeTokenNeverFromTheClient(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")
	for _, name := range []string{"Skiff-Node-Token", "skiff-node-token", "Skiff_Node_Token", "SKIFF-NODE-TOKEN"} {
		req := h.request(http.MethodGet, "/", id, "8080", nil)
		req.Header[name] = []string{"forged", "forged-again"}
		if resp, _ := h.do(req); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", name, resp.StatusCode)
		}
		got := a.last(t)
		for k, vs := range got.Header {
			if isNodeTokenHeader(k) && (k != wire.NodeTokenHeader || len(vs) != 1 || vs[0] != nodeToken) {
				t.Errorf("client header %s: sandboxd got %s = %q", name, k, vs)
			}
		}
		if got.Header.Get(wire.NodeTokenHeader) != nodeToken {
			t.Errorf("client header %s: node token missing", name)
		}
	}
	// Connection may not list the routing or node headers away.
	req := h.request(http.MethodGet, "/", id, "8080", nil)
	req.Header.Set("Connection", "Skiff-Node-Token, E2b-Sandbox-Id")
	if resp, _ := h.do(req); resp.StatusCode != http.StatusOK {
		t.Fatalf("Connection header: %d", resp.StatusCode)
	}
	if got := a.last(t); got.Header.Get(wire.NodeTokenHeader) != nodeToken || got.Header.Get("E2b-Sandbox-Id") != id {
		t.Errorf("Connection header removed routing: %v", got.Header)
	}
}

// Each node's requests carry that node's token (a token per host, derived
// from the fleet key), never another node's.
func TestEachNodeGetsItsOwnToken(t *testing.T) {
	a, b := newUpstream(t, "node-a", ok("node-a")), newUpstream(t, "node-b", ok("node-b"))
	h := newHarness(t, harnessOptions{nodeToken: func(node string) string { return "token-of-" + node }}, a, b)
	for _, u := range []*upstream{a, b, a} {
		if resp, _ := h.do(h.request(http.MethodGet, "/", sandbox(t, u.node), "8080", nil)); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", u.node, resp.StatusCode)
		}
		if got := u.last(t).Header.Values(wire.NodeTokenHeader); len(got) != 1 || got[0] != "token-of-"+u.node {
			t.Errorf("sandboxd of %s got %s %q", u.node, wire.NodeTokenHeader, got)
		}
	}
}

func TestBlockedEnvdPathsAnswer404WithoutUpstream(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")
	for _, p := range []string{"/init", "/init/", "/freeze", "/unfreeze", "/collapse", "/fsfreeze", "/fsthaw", "/upgrade",
		"//init", "/./init", "/x/../init", "/%69nit"} {
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			req := h.request(method, "/", id, "49983", nil)
			req.URL.Opaque = "//" + req.URL.Host + p // the raw path, as sent
			resp, body := h.do(req)
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s %s: %d %q, want 404", method, p, resp.StatusCode, body)
				continue
			}
			if e := apiErr(t, body); e.Code != http.StatusNotFound {
				t.Errorf("%s %s: body %+v", method, p, e)
			}
		}
	}
	if n := a.accepts.Load(); n != 0 {
		t.Fatalf("sandboxd accepted %d connections for blocked paths", n)
	}
	// Only envd's port is guarded: a user's service may have /init.
	if resp, _ := h.do(h.request(http.MethodPost, "/init", id, "8080", nil)); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /init on port 8080: %d", resp.StatusCode)
	}
	if resp, _ := h.do(h.request(http.MethodGet, "/initial", id, "49983", nil)); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /initial on envd: %d", resp.StatusCode)
	}
}

func TestBadTargetsAnswer400WithoutUpstream(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")
	for name, hdr := range map[string]map[string]string{
		"id only":          {"E2b-Sandbox-Id": id},
		"port only":        {"E2b-Sandbox-Port": "49983"},
		"port not numeric": {"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "envd"},
		"port 0":           {"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "0"},
		"port too big":     {"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "70000"},
		"upper-case id":    {"E2b-Sandbox-Id": strings.ToUpper(id), "E2b-Sandbox-Port": "49983"},
		"quote in the id":  {"E2b-Sandbox-Id": `a"b\c`, "E2b-Sandbox-Port": "49983"}, // repeated in the message: still JSON
		"no target":        {},
		"unknown token":    {"X-Access-Token": "never-seen"},
	} {
		req := h.request(http.MethodGet, "/files?path=%2Fa", "", "", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, body := h.do(req)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %q, want 400", name, resp.StatusCode, body)
			continue
		}
		if e := apiErr(t, body); e.Code != http.StatusBadRequest || e.Message == "" {
			t.Errorf("%s: body %+v", name, e)
		}
	}
	req := h.request(http.MethodGet, "/", "", "", nil)
	req.Host = "49983-NOT_AN_ID.example.com"
	if resp, body := h.do(req); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad host: %d %q", resp.StatusCode, body)
	}
	if n := a.accepts.Load(); n != 0 {
		t.Fatalf("sandboxd accepted %d connections for bad requests", n)
	}
}

func TestSandboxOnNoFreshNodeAnswers502AtOnce(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	b := newUpstream(t, "node-b", ok("node-b"))
	h := newHarness(t, harnessOptions{}, a, b)
	idB := sandbox(t, "node-b")
	if resp, body := h.do(h.request(http.MethodGet, "/", idB, "49983", nil)); resp.StatusCode != http.StatusOK || body != "ok from node-b" {
		t.Fatalf("node-b while fresh: %d %q", resp.StatusCode, body)
	}
	h.src.Remove("node-b") // stale or gone: the source drops it
	h.refresh()
	acceptsA, acceptsB := a.accepts.Load(), b.accepts.Load()
	reqsA, reqsB := len(a.requests()), len(b.requests())

	for _, id := range []string{idB, sandbox(t, "node-unknown"), "abc", idB + "x", strings.Repeat("a", 64)} {
		resp, body := h.do(h.request(http.MethodGet, "/files", id, "49983", nil))
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("%s: %d %q, want 502", id, resp.StatusCode, body)
		}
		var e struct {
			SandboxID string `json:"sandboxId"`
			Message   string `json:"message"`
			Code      int    `json:"code"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.SandboxID != id || e.Code != 502 || e.Message != "The sandbox was not found" {
			t.Fatalf("%s: body %q (%v)", id, body, err)
		}
	}
	req := h.request(http.MethodGet, "/", idB, "3000", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	if resp, body := h.do(req); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "Sandbox not found") ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("browser: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if a.accepts.Load() != acceptsA || b.accepts.Load() != acceptsB || len(a.requests()) != reqsA || len(b.requests()) != reqsB {
		t.Fatalf("a 502 touched a node: accepts a %d→%d b %d→%d, requests a %d→%d b %d→%d",
			acceptsA, a.accepts.Load(), acceptsB, b.accepts.Load(), reqsA, len(a.requests()), reqsB, len(b.requests()))
	}
}

func TestUnreachableHostAnswers502(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	endpoint := a.endpoint()
	h := newHarness(t, harnessOptions{}, a)
	a.Close() // the node is fresh, its sandboxd is not there
	resp, body := h.do(h.request(http.MethodGet, "/", sandbox(t, "node-a"), "49983", nil))
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if e := apiErr(t, body); e.Code != 502 || strings.Contains(e.Message, endpoint) {
		t.Fatalf("body %+v (must not name the internal endpoint %s)", e, endpoint)
	}
}

// An answer whose headers pass 1 MiB (a tenant's server) is a 502, not
// held in the proxy's memory; one just under passes.
func TestAnswerHeadersBounded(t *testing.T) {
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kib, _ := strconv.Atoi(r.URL.Query().Get("kib"))
		for i := range kib / 32 {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("h", 32<<10))
		}
		_, _ = io.WriteString(w, "body")
	}))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")
	for kib, want := range map[int]int{900: http.StatusOK, 2048: http.StatusBadGateway} {
		if resp, _ := h.do(h.request(http.MethodGet, fmt.Sprintf("/?kib=%d", kib), id, "8080", nil)); resp.StatusCode != want {
			t.Errorf("an answer with %d KiB of headers: %d, want %d", kib, resp.StatusCode, want)
		}
	}
}

func TestNotReadyAnswers503(t *testing.T) {
	a := newUpstream(t, "node-a", ok("node-a"))
	h := newHarness(t, harnessOptions{}, a)
	h.ready.Store(false)
	resp, body := h.do(h.request(http.MethodGet, "/", sandbox(t, "node-a"), "49983", nil))
	if resp.StatusCode != http.StatusServiceUnavailable || apiErr(t, body).Code != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if a.accepts.Load() != 0 {
		t.Fatal("a request before sync reached sandboxd")
	}
}

func TestTokenFallbackRouting(t *testing.T) {
	// Sandboxd answers what the X-Status header says (default 200).
	status := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusOK
		if s := r.Header.Get("X-Status"); s != "" {
			code, _ = strconv.Atoi(s)
		}
		w.WriteHeader(code)
	})
	a := newUpstream(t, "node-a", status)
	h := newHarness(t, harnessOptions{tokenRoutes: 2}, a)
	id1, id2, id3 := sandbox(t, "node-a"), sandbox(t, "node-a"), sandbox(t, "node-a")

	// tokenOnly is an old SDK's /files call: the token, no routing headers.
	tokenOnly := func(token string) (int, string) {
		req := h.request(http.MethodGet, "/files?path=%2Fhome%2Fuser%2Fa", "", "", nil)
		req.Header.Set("X-Access-Token", token)
		resp, _ := h.do(req)
		if resp.StatusCode == http.StatusOK {
			return resp.StatusCode, a.last(t).Header.Get("E2b-Sandbox-Id")
		}
		return resp.StatusCode, ""
	}
	routedAs := func(method, id, token, path, status string) {
		t.Helper()
		req := h.request(method, path, id, "49983", nil)
		req.Header.Set("X-Access-Token", token)
		if status != "" {
			req.Header.Set("X-Status", status)
		}
		h.do(req)
	}
	routed := func(id, token, path, status string) {
		t.Helper()
		routedAs(http.MethodPost, id, token, path, status)
	}

	if code, _ := tokenOnly("token-1"); code != http.StatusBadRequest {
		t.Fatalf("an unseen token: %d, want 400", code)
	}
	routed(id1, "token-1", "/process.Process/List", "")
	if code, got := tokenOnly("token-1"); code != http.StatusOK || got != id1 {
		t.Fatalf("token-1 after a routed call: %d to %q, want %s", code, got, id1)
	}
	if got := a.last(t); got.Header.Get("E2b-Sandbox-Port") != "49983" || got.URL.Path != "/files" {
		t.Fatalf("token-routed request reached sandboxd as port %q path %q", got.Header.Get("E2b-Sandbox-Port"), got.URL.Path)
	}

	// Not learned: envd refused the token; it answered without checking
	// it (a CORS preflight or any OPTIONS, /health); the answer was no
	// success (a redirect, a 4xx, the 502 of a sandbox that was gone); the
	// token names its sandbox already; or the port was not envd's.
	named := id1 + ".0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ method, token, path, status string }{
		{http.MethodPost, "token-401", "/process.Process/List", "401"},
		{http.MethodPost, "token-403", "/process.Process/List", "403"},
		{http.MethodPost, "token-health", "/health", ""},
		{http.MethodGet, "token-health-get", "/health", "204"},
		{http.MethodHead, "token-health-head", "/health/", ""},
		{http.MethodOptions, "token-options", "/process.Process/List", "204"},
		{http.MethodOptions, "token-options-files", "/files", ""},
		{http.MethodPost, "token-307", "//files", "307"},
		{http.MethodPost, "token-404", "/process.Process/Nope", "404"},
		{http.MethodPost, "token-400", "/files", "400"},
		{http.MethodPost, "token-502", "/process.Process/List", "502"},
		{http.MethodPost, named, "/process.Process/List", ""},
	} {
		routedAs(tc.method, id2, tc.token, tc.path, tc.status)
		if n := h.tokens.Len(); n != 1 {
			t.Errorf("%s %s answered %q: %d tokens known, want only token-1", tc.method, tc.path, tc.status, n)
		}
		if code, got := tokenOnly(tc.token); tc.token != named && code != http.StatusBadRequest {
			t.Errorf("%s %s answered %q taught the proxy its token: a token-only call went to %q (%d)", tc.method, tc.path, tc.status, got, code)
		}
	}
	req := h.request(http.MethodGet, "/", id2, "8080", nil)
	req.Header.Set("X-Access-Token", "token-user-port")
	h.do(req)
	if code, _ := tokenOnly("token-user-port"); code != http.StatusBadRequest {
		t.Errorf("a call to port 8080 taught the proxy its token: token-only call got %d", code)
	}
	if code, got := tokenOnly("token-1"); code != http.StatusOK || got != id1 {
		t.Fatalf("token-1 after the calls that teach nothing: %d to %q, want %s", code, got, id1)
	}

	// The bound: learning two more forgets token-1, the least recently used.
	routed(id2, "token-2", "/files", "")
	routed(id3, "token-3", "/files", "")
	if code, _ := tokenOnly("token-1"); code != http.StatusBadRequest {
		t.Errorf("token-1 beyond the bound of 2: %d", code)
	}
	if code, got := tokenOnly("token-3"); code != http.StatusOK || got != id3 {
		t.Errorf("token-3: %d to %q", code, got)
	}

	// A token-routed call that finds the sandbox gone forgets the token.
	req = h.request(http.MethodGet, "/files", "", "", nil)
	req.Header.Set("X-Access-Token", "token-3")
	req.Header.Set("X-Status", "502")
	if resp, _ := h.do(req); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("token-3 to a gone sandbox: %d", resp.StatusCode)
	}
	if code, _ := tokenOnly("token-3"); code != http.StatusBadRequest {
		t.Errorf("token-3 still routes after its sandbox was gone: %d", code)
	}
	// And one whose sandbox left the fleet.
	if code, _ := tokenOnly("token-2"); code != http.StatusOK {
		t.Fatalf("token-2: %d", code)
	}
	h.src.Remove("node-a")
	h.refresh()
	req = h.request(http.MethodGet, "/files", "", "", nil)
	req.Header.Set("X-Access-Token", "token-2")
	if resp, _ := h.do(req); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("token-2 after node-a left: %d", resp.StatusCode)
	}
	if h.tokens.Len() != 0 {
		t.Errorf("%d tokens left, want 0", h.tokens.Len())
	}
}

func TestLogsCarryNoTokens(t *testing.T) {
	a := newUpstream(t, "node-a", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}))
	h := newHarness(t, harnessOptions{}, a)
	id := sandbox(t, "node-a")
	secrets := []string{"secret-access-token-A", "secret-basic-B", "secret-traffic-C", "secret-forged-node-D", "secret-signature-E", nodeToken}
	send := func(req *http.Request) {
		req.Header.Set("X-Access-Token", secrets[0])
		req.Header.Set("Authorization", "Basic "+secrets[1])
		req.Header.Set("E2b-Traffic-Access-Token", secrets[2])
		req.Header.Set("Skiff-Node-Token", secrets[3])
		h.do(req)
	}
	q := "?path=%2Fa&signature=" + url.QueryEscape(secrets[4]) + "&signature_expiration=1"
	send(h.request(http.MethodGet, "/files"+q, id, "49983", nil))                   // proxied, 401
	send(h.request(http.MethodGet, "/files"+q, "", "", nil))                        // 400
	send(h.request(http.MethodPost, "/init"+q, id, "49983", nil))                   // 404
	send(h.request(http.MethodGet, "/files"+q, sandbox(t, "node-x"), "49983", nil)) // 502 unknown
	a.Close()
	send(h.request(http.MethodGet, "/files"+q, id, "49983", nil)) // 502 unreachable
	logs := h.logs.String()
	if !strings.Contains(logs, "forward to sandboxd failed") || !strings.Contains(logs, `"msg":"proxied"`) {
		t.Fatalf("the test did not log what it meant to: %s", logs)
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			t.Errorf("logs carry %q:\n%s", s, logs)
		}
	}
	if strings.Contains(logs, "signature") {
		t.Errorf("logs carry the query string:\n%s", logs)
	}
}

// Every error the proxy answers itself says what failed without the
// node's address, which goes to the log instead.
func TestErrorsNameNoAddress(t *testing.T) {
	hangUp := newUpstream(t, "node-h", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close() // before any answer
		}
	}))
	down := newUpstream(t, "node-d", ok("node-d"))
	h := newHarness(t, harnessOptions{}, hangUp, down)
	down.Close()
	for _, u := range []*upstream{hangUp, down} {
		resp, body := h.do(h.request(http.MethodGet, "/files?path=%2Fa", sandbox(t, u.node), "49983", nil))
		host, _, _ := net.SplitHostPort(u.endpoint())
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, u.endpoint()) || strings.Contains(body, host) {
			t.Errorf("%s: %d %q, want a 502 that names no address", u.node, resp.StatusCode, body)
		}
		if !strings.Contains(h.logs.String(), u.endpoint()) {
			t.Errorf("%s: the log does not name the endpoint %s:\n%s", u.node, u.endpoint(), h.logs)
		}
	}
}

// Behind a trusted reverse proxy that ends TLS, the client's scheme and
// host pass on (an app behind https must not be told http); from any other
// client they are this hop's. The query passes as it came, pairs Go's
// parser would drop (';', a bad escape) included.
func TestForwardedSchemeAndRawQuery(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		a := newUpstream(t, "node-a", ok("node-a"))
		var opts harnessOptions
		if trusted {
			opts.trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		}
		h := newHarness(t, opts, a)
		id := sandbox(t, "node-a")
		req := h.request(http.MethodGet, "/p?a=1;b=2&q=100%", id, "8080", nil)
		req.Header.Set("X-Forwarded-Proto", "https")
		req.Header.Set("X-Forwarded-Host", "app.example.com")
		if resp, body := h.do(req); resp.StatusCode != http.StatusOK {
			t.Fatalf("trusted %v: %d %s", trusted, resp.StatusCode, body)
		}
		got := a.last(t)
		proto, host := got.Header.Values("X-Forwarded-Proto"), got.Header.Values("X-Forwarded-Host")
		wantProto, wantHost := "http", strings.TrimPrefix(h.srv.URL, "http://")
		if trusted {
			wantProto, wantHost = "https", "app.example.com"
		}
		if len(proto) != 1 || proto[0] != wantProto || len(host) != 1 || host[0] != wantHost {
			t.Errorf("trusted %v: sandboxd got X-Forwarded-Proto %q, -Host %q; want %q, %q", trusted, proto, host, wantProto, wantHost)
		}
		if got.URL.RawQuery != "a=1;b=2&q=100%" {
			t.Errorf("trusted %v: sandboxd got the query %q, want it as sent", trusted, got.URL.RawQuery)
		}
	}
}

// A host that leaves the fleet (its inventory went stale: dead, or cut off)
// takes its requests in flight with it: one not yet answered gets a 502 at
// once, a stream already answered is cut, rather than both waiting for TCP
// to give up on a host that no longer answers. Another node's stream goes
// on.
func TestNodeGoneEndsItsRequests(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
		}
		select { // a host that stopped answering
		case <-release:
		case <-r.Context().Done():
		}
	})
	a, b := newUpstream(t, "node-a", handler), newUpstream(t, "node-b", handler)
	h := newHarness(t, harnessOptions{}, a, b)
	onA, onB := sandbox(t, "node-a"), sandbox(t, "node-b")

	type result struct {
		status int
		body   string
		err    error
	}
	send := func(id, path string) <-chan result {
		out := make(chan result, 1)
		req := h.request(http.MethodGet, path, id, "8080", nil)
		if path == "/stream" {
			resp, err := h.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = resp.Body.Close() })
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
				t.Fatalf("the stream's first line: %q, %v", line, err)
			}
			go func() {
				rest, err := io.ReadAll(br)
				out <- result{resp.StatusCode, string(rest), err}
			}()
			return out
		}
		go func() {
			resp, err := h.srv.Client().Do(req)
			if err != nil {
				out <- result{err: err}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			out <- result{resp.StatusCode, string(body), nil}
		}()
		return out
	}
	waiting := send(onA, "/wait")
	streaming := send(onA, "/stream")
	other := send(onB, "/stream")
	for deadline := time.Now().Add(10 * time.Second); len(a.requests()) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the requests to node-a never reached it")
		}
	}

	// node-a gone from another endpoint (it moved, and its requests are to
	// where it is now): nothing of these ends.
	h.proxy.NodesGone([]fleet.Node{{Name: "node-a", Endpoint: "192.0.2.1:9000"}})
	select {
	case r := <-waiting:
		t.Fatalf("a request to node-a's endpoint ended for another endpoint's: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}

	h.src.Remove("node-a")
	h.refresh()
	select {
	case r := <-waiting:
		if r.err != nil || r.status != http.StatusBadGateway || !strings.Contains(r.body, "left the fleet") {
			t.Errorf("the request waiting on the gone host: %d %q %v; want e2b's 502 saying so", r.status, r.body, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request waiting on the gone host still waits")
	}
	select {
	case r := <-streaming:
		if r.err == nil {
			t.Errorf("the stream from the gone host ended cleanly (%q); want it cut", r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream from the gone host still runs")
	}
	select {
	case r := <-other:
		t.Fatalf("node-b's stream ended with node-a: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
}
