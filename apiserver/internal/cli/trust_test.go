package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// tokenHost stands in for one host's sandboxd that accepts only its own
// node token: Get answers for its sandboxes (of team-a), to callers with
// the token. It keeps every Authorization it was sent, token or not.
type tokenHost struct {
	sandboxdv1connect.UnimplementedSandboxdServiceHandler
	node, token string
	ids         map[string]bool
	srv         *httptest.Server

	mu    sync.Mutex
	auths []string
}

func newTokenHost(t *testing.T, node, token string) *tokenHost {
	t.Helper()
	h := &tokenHost{node: node, token: token, ids: map[string]bool{}}
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(h))
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.auths = append(h.auths, r.Header.Get("Authorization"))
		h.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+h.token {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *tokenHost) endpoint() string { return strings.TrimPrefix(h.srv.URL, "http://") }

func (h *tokenHost) newSandbox(t *testing.T) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(h.node))
	if err != nil {
		t.Fatal(err)
	}
	h.ids[id] = true
	return id
}

func (h *tokenHost) sent() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.auths...)
}

func (h *tokenHost) Get(_ context.Context, req *connect.Request[pb.GetRequest]) (*connect.Response[pb.GetResponse], error) {
	id := req.Msg.GetSandboxId()
	if !h.ids[id] {
		return nil, connect.NewError(connect.CodeNotFound, nil)
	}
	return connect.NewResponse(&pb.GetResponse{
		Sandbox:         &pb.Sandbox{Id: id, Template: "base", Team: "team-a", State: pb.SandboxState_SANDBOX_STATE_RUNNING},
		EnvdAccessToken: "envd-token-of-" + id,
	}), nil
}

// The attack of issue 14, point 10, on the apiserver: hosts publish with
// their own identities, and sandbox-apiserver --inventory kube
// --node-token-key-file calls each host with its own token. Without the
// admission policy host-a's identity points host-b's NodeInventory at
// host-a, and the apiserver then calls host-a for host-b's sandbox with
// host-b's token. With api/policies that write is refused, and host-b's
// sandbox is served by host-b alone.
func TestKubeModeOneHostCannotTakeAnothersCalls(t *testing.T) {
	env := kubetest.StartWith(t, kubetest.Options{NoPolicies: true})
	env.InstallRBAC(t)
	createNamespaces(t, env.Client, "team-a")
	kc := kubetest.WriteKubeconfig(t, env.Config)
	key, _ := keysCreate(t, kc, "team-a")
	fleetKey := []byte("fleet-key-of-the-apiserver-trust-test")
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, fleetKey, 0o600); err != nil {
		t.Fatal(err)
	}
	tokenA, tokenB := nodetoken.Derive(fleetKey, "host-a"), nodetoken.Derive(fleetKey, "host-b")
	a, b := newTokenHost(t, "host-a", tokenA), newTokenHost(t, "host-b", tokenB)
	idA, idB := a.newSandbox(t), b.newSandbox(t)
	hostA, hostB := env.NodeUser(t, "host-a").Client, env.NodeUser(t, "host-b").Client
	publish(t, hostA, "host-a", a.endpoint(), time.Now(), []string{"base"}, entry(idA, "team-a", v1beta1.SandboxRunning))
	publish(t, hostB, "host-b", b.endpoint(), time.Now(), []string{"base"}, entry(idB, "team-a", v1beta1.SandboxRunning))

	s := startServing(t, parseServe(t, "--inventory", "kube", "--kubeconfig", kc, "--node-token-key-file", keyFile, "--admin-listen", "127.0.0.1:0"))
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
	e2b := api{t: t, base: s.api}
	getSandbox := func(id string) int {
		code, _ := e2b.call(key, http.MethodGet, "/sandboxes/"+id, "")
		return code
	}
	waitFor(t, "both hosts' sandboxes are found", func() bool { return getSandbox(idA) == http.StatusOK && getSandbox(idB) == http.StatusOK })
	for _, h := range []*tokenHost{a, b} {
		for _, got := range h.sent() {
			if got != "Bearer "+h.token {
				t.Fatalf("%s was sent %q, want only its own token", h.node, got)
			}
		}
	}

	// Without the policy: host-a takes host-b's calls, and its token.
	if err := tryPublish(t.Context(), hostA, "host-b", a.endpoint(), time.Now(), []string{"base"}, entry(idB, "team-a", v1beta1.SandboxRunning)); err != nil {
		t.Fatalf("without the policy, host-a rewriting host-b's inventory: %v", err)
	}
	waitFor(t, "host-b's sandbox is asked of host-a", func() bool {
		getSandbox(idB)
		sent := a.sent()
		return len(sent) > 0 && sent[len(sent)-1] == "Bearer "+tokenB
	})
	t.Log("without the policy host-a's identity received the apiserver's calls for host-b, with host-b's token")

	// With the policy: refused; host-b's own publish takes its calls back.
	env.InstallPolicies(t)
	publish(t, hostB, "host-b", b.endpoint(), time.Now(), []string{"base"}, entry(idB, "team-a", v1beta1.SandboxRunning))
	err := tryPublish(t.Context(), hostA, "host-b", a.endpoint(), time.Now(), []string{"base"}, entry(idB, "team-a", v1beta1.SandboxRunning))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "skiff:node:host-a may not") {
		t.Fatalf("with the policy, host-a rewriting host-b's inventory: %v, want Forbidden by the policy", err)
	}
	waitFor(t, "host-b's sandbox is found on host-b", func() bool { return getSandbox(idB) == http.StatusOK })
	before := len(a.sent())
	for range 5 {
		if code := getSandbox(idB); code != http.StatusOK {
			t.Fatalf("GET host-b's sandbox = %d", code)
		}
	}
	if n := len(a.sent()) - before; n != 0 {
		t.Errorf("host-a was called %d times for host-b's sandbox", n)
	}
}
