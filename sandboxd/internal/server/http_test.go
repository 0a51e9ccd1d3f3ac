package server

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	"github.com/skiff-dev/skiff/shared/routing"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/wire"
)

func TestAuthRPC(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	info := func(c *http.Client) error {
		_, err := sandboxdv1connect.NewSandboxdServiceClient(c, h.url).Info(t.Context(), connect.NewRequest(&pb.InfoRequest{}))
		return err
	}
	wantCode(t, info(servicetest.H2CClient("")), connect.CodeUnauthenticated)
	wantCode(t, info(servicetest.H2CClient("wrong-token-0123456789")), connect.CodeUnauthenticated)
	if err := info(servicetest.H2CClient(testNodeToken)); err != nil {
		t.Fatalf("bearer token: %v", err)
	}
	nodeHeader := &http.Client{Transport: headerRT{wire.NodeTokenHeader, testNodeToken}}
	if err := info(nodeHeader); err != nil {
		t.Fatalf("%s: %v", wire.NodeTokenHeader, err)
	}

	// Plain HTTP/1.1 Connect JSON without a token: 401.
	resp, err := http.Post(h.url+sandboxdv1connect.SandboxdServiceInfoProcedure, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"unauthenticated"`) {
		t.Fatalf("no token: %d %s", resp.StatusCode, body)
	}
}

type headerRT struct{ name, value string }

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return http.DefaultTransport.RoundTrip(r)
}

// TestRelay sends requests for a sandbox's port through sandboxd: they
// need the node token, which never reaches the sandbox, while the
// sandbox's own headers (access token, Basic user) go through.
func TestRelay(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	sb := h.create().GetSandbox()
	rec, _ := h.reg.Get(sb.GetId())

	// A server in the sandbox, at its address, that echoes headers.
	ln, err := net.Listen("tcp", net.JoinHostPort(rec.Address, "0"))
	if err != nil {
		t.Fatal(err)
	}
	upstream := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{
			"node":          r.Header.Get(wire.NodeTokenHeader),
			"access":        r.Header.Get(wire.AccessTokenHeader),
			"authorization": r.Header.Get("Authorization"),
			"path":          r.URL.Path,
		})
	})}
	go func() { _ = upstream.Serve(ln) }()
	defer upstream.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	send := func(id string, header map[string]string, host string) (int, map[string]string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h.url+"/files", http.NoBody)
		if host != "" {
			req.Host = host
		} else {
			req.Header.Set(routing.HeaderSandboxID, id)
			req.Header.Set(routing.HeaderSandboxPort, port)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&got)
		return resp.StatusCode, got
	}

	status, got := send(sb.GetId(), map[string]string{
		wire.NodeTokenHeader: testNodeToken, wire.AccessTokenHeader: "envd-token", "Authorization": "Basic dXNlcjo=",
	}, "")
	if status != http.StatusOK || got["node"] != "" || got["access"] != "envd-token" || got["authorization"] != "Basic dXNlcjo=" || got["path"] != "/files" {
		t.Fatalf("relayed: %d %v (the node token must be stripped, the rest kept)", status, got)
	}
	status, got = send("", map[string]string{wire.NodeTokenHeader: testNodeToken}, port+"-"+sb.GetId()+".sandbox.example")
	if status != http.StatusOK || got["node"] != "" {
		t.Fatalf("relayed by host: %d %v", status, got)
	}

	for _, tc := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"no token", nil, http.StatusUnauthorized},
		{"wrong token", map[string]string{wire.NodeTokenHeader: "nope"}, http.StatusUnauthorized},
		// The Authorization of a relayed request is the sandbox's.
		{"bearer is not enough", map[string]string{"Authorization": "Bearer " + testNodeToken}, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, got := send(sb.GetId(), tc.header, ""); status != tc.want {
				t.Fatalf("status %d %v, want %d", status, got, tc.want)
			}
		})
	}

	// Unknown, paused and warm sandboxes are not reachable: e2b's 502.
	if status, _ := send("aaaaaaaaaaaaaaaaaaaa", map[string]string{wire.NodeTokenHeader: testNodeToken}, ""); status != http.StatusBadGateway {
		t.Fatalf("unknown sandbox: %d", status)
	}
	if _, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: sb.GetId()})); err != nil {
		t.Fatal(err)
	}
	if status, _ := send(sb.GetId(), map[string]string{wire.NodeTokenHeader: testNodeToken}, ""); status != http.StatusBadGateway {
		t.Fatalf("paused sandbox: %d", status)
	}
	warm := h.warm(1)[0]
	if status, _ := send(warm, map[string]string{wire.NodeTokenHeader: testNodeToken}, ""); status != http.StatusBadGateway {
		t.Fatalf("warm sandbox: %d", status)
	}
}

// TestRelayUnauthorized: a relayed request without the node token is
// answered in e2b's error JSON, whatever the message holds.
func TestRelayUnauthorized(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h.url+"/files", http.NoBody)
	req.Header.Set(routing.HeaderSandboxID, "aaaaaaaaaaaaaaaaaaaa")
	req.Header.Set(routing.HeaderSandboxPort, "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body wire.Error
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("401 body is not JSON: %v", err)
	}
	if resp.StatusCode != http.StatusUnauthorized || body.Code != http.StatusUnauthorized || !strings.Contains(body.Message, wire.NodeTokenHeader) ||
		resp.Header.Get("WWW-Authenticate") == "" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("= %d %+v %v", resp.StatusCode, body, resp.Header)
	}
}

func TestInsecureNoAuth(t *testing.T) {
	h := newHarness(t, harnessConfig{cfg: func(c *Config) { c.AuthTokenFile, c.InsecureNoAuth = "", true }})
	if _, err := sandboxdv1connect.NewSandboxdServiceClient(servicetest.H2CClient(""), h.url).Info(t.Context(), connect.NewRequest(&pb.InfoRequest{})); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesNoAuth: a server with neither a token nor a client CA
// must be told InsecureNoAuth, and a client CA needs a certificate.
func TestNewRefusesNoAuth(t *testing.T) {
	if _, err := New(Config{}, nil, nil); err == nil || !strings.Contains(err.Error(), "InsecureNoAuth") {
		t.Fatalf("New without auth = %v", err)
	}
	if _, err := New(Config{ClientCA: "ca.pem"}, nil, nil); err == nil || !strings.Contains(err.Error(), "--client-ca needs --tls-cert") {
		t.Fatalf("New with a client CA and no certificate = %v", err)
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := readToken(write("ok", "  0123456789abcdef\n")); err != nil || tok != "0123456789abcdef" {
		t.Fatalf("readToken = %q, %v", tok, err)
	}
	if _, err := readToken(write("short", "abc\n")); err == nil {
		t.Fatal("a 3-character token was accepted")
	}
	if _, err := readToken(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing token file was accepted")
	}
	if tok, err := readToken(""); tok != "" || err != nil {
		t.Fatalf("readToken without a file = %q, %v", tok, err)
	}
}

func TestAdmin(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create().GetSandbox().GetId()
	h.warm(1)
	if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	_, _ = h.client.Get(t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	get := func(path string) (int, string) {
		resp, err := http.Get(h.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get("/healthz"); status != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", status, body)
	}
	status, body := get("/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics = %d", status)
	}
	for _, want := range []string{
		`skiff_sandboxd_sandboxes{state="warm"} 1`,
		`skiff_sandboxd_sandboxes{state="running"} 0`,
		`skiff_sandboxd_creates_total{kind="create",result="ok"} 1`,
		`skiff_sandboxd_creates_total{kind="warm",result="ok"} 1`,
		`skiff_sandboxd_kills_total{reason="api",result="ok"} 1`,
		`skiff_sandboxd_rpc_requests_total{code="not_found",method="Get"} 1`,
		`skiff_sandboxd_rpc_requests_total{code="ok",method="Create"} 1`,
		`skiff_sandboxd_create_duration_seconds_count{kind="create"} 1`,
		`skiff_sandboxd_envd_ready_duration_seconds_count 2`,
		`skiff_sandboxd_capacity{resource="sandboxes"} 64`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}
