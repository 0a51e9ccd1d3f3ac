package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// Two real hosts, each sandboxd with its own token derived from the fleet
// key (sandbox-apiserver node-token), each publishing its NodeInventory
// with its own identity (skiff:node:<node> in skiff:nodes, under the
// shipped policy); sandbox-apiserver and sandbox-envd-proxy in kube mode
// hold only the key (--node-token-key-file). Creates land on both hosts,
// the proxy relays into a sandbox on each, and host-a's token is refused
// by host-b's sandboxd, for its API and its relay alike.
func TestKubeModeTokenPerHost(t *testing.T) {
	env := kubetest.Start(t)
	const mod = "github.com/skiff-dev/skiff/"
	build := hosttest.Options{Name: "pta", NodeName: "host-a", Build: []string{mod + "apiserver/cmd/sandbox-apiserver", mod + "envd-proxy/cmd/sandbox-envd-proxy"}}
	// The key, and each host's token as an operator makes it.
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "node-token-key")
	if err := os.WriteFile(keyFile, []byte("a-fleet-key-for-the-token-per-host-e2e-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	apiserverBin := hosttest.Build(t, dir, build.Build[0], "CGO_ENABLED=0")
	tokenOf := func(node string) string {
		out, err := exec.Command(apiserverBin, "node-token", "--key-file", keyFile, node).Output()
		if err != nil {
			t.Fatalf("node-token %s: %v", node, err)
		}
		return strings.TrimSpace(string(out))
	}
	tokenA, tokenB := tokenOf("host-a"), tokenOf("host-b")
	if tokenA == tokenB || len(tokenA) != 64 {
		t.Fatalf("node tokens %q and %q", tokenA, tokenB)
	}
	build.Token = tokenA
	a := hosttest.NewHost(t, build)
	b := hosttest.NewHost(t, hosttest.Options{Name: "ptb", NodeName: "host-b", Token: tokenB})
	publishHost(t, env.NodeUser(t, "host-a").Client, a.Addr, a.Token, 2*time.Second)
	publishHost(t, env.NodeUser(t, "host-b").Client, b.Addr, b.Token, 2*time.Second)

	ctx := t.Context()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &v1beta1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: "base"},
		Spec: v1beta1.SandboxTemplateSpec{Source: v1beta1.TemplateSource{Builtin: "base"}, CPUMilli: 500, MemoryMiB: 256}}); err != nil {
		t.Fatal(err)
	}
	kc := env.Kubeconfig(t)
	out, err := exec.Command(apiserverBin, "keys", "create", "--team", "team-a", "--kubeconfig", kc).Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	s := &system{t: t, dir: a.Dir, keyA: strings.TrimSpace(string(out))}
	s.api = "http://" + hosttest.FreeAddr(t)
	start(t, a.Dir, "apiserver", a.Bins["sandbox-apiserver"], "serve", "--listen", strings.TrimPrefix(s.api, "http://"), "--admin-listen", hosttest.FreeAddr(t),
		"--inventory", "kube", "--kubeconfig", kc, "--node-token-key-file", keyFile)
	proxy := hosttest.FreeAddr(t)
	start(t, a.Dir, "envd-proxy", a.Bins["sandbox-envd-proxy"], "serve", "--listen", proxy, "--admin-listen", hosttest.FreeAddr(t),
		"--inventory", "kube", "--kubeconfig", kc, "--node-token-key-file", keyFile)

	// Creates until both hosts hold one (placement takes the freer host, so
	// the second create goes to the other). Until the apiserver listens a
	// create gets no answer; until it sees a host, 503 or the other host.
	onNode := map[string]string{} // node → sandbox ID
	for deadline := time.Now().Add(90 * time.Second); len(onNode) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("creates reached only %v", onNode)
		}
		code, body := s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 300})
		if code == 0 || code == http.StatusServiceUnavailable {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if code != http.StatusCreated {
			t.Fatalf("create: %d %s", code, body)
		}
		var created struct{ SandboxID, ClientID string }
		if err := json.Unmarshal(body, &created); err != nil {
			t.Fatal(err)
		}
		if _, ok := onNode[created.ClientID]; !ok {
			onNode[created.ClientID] = created.SandboxID
		}
	}
	t.Logf("sandboxes: %v", onNode)

	// Through the proxy into each host's sandbox, each with its own token.
	for _, node := range []string{"host-a", "host-b"} {
		id := onNode[node]
		var code int
		var body string
		for deadline := time.Now().Add(30 * time.Second); ; {
			code, body = getVia(t, "http://"+proxy+"/health", map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"})
			if code/100 == 2 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // the proxy's index learns the host from its inventory
		}
		if code/100 != 2 {
			t.Errorf("envd /health of %s's sandbox through the proxy: %d %s", node, code, body)
		}
		if code, body := s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusOK {
			t.Errorf("get %s's sandbox: %d %s", node, code, body)
		}
	}

	// host-a's token is no good on host-b; host-b's own is.
	idB := onNode["host-b"]
	for _, tc := range []struct {
		token string
		want  connect.Code
	}{{tokenA, connect.CodeUnauthenticated}, {tokenB, 0}} {
		_, err := sandboxdapi.NewClients(tc.token, nil)(b.Addr).Get(ctx, connect.NewRequest(&pb.GetRequest{SandboxId: idB}))
		if got := connect.CodeOf(err); (err == nil) != (tc.want == 0) || (err != nil && got != tc.want) {
			t.Errorf("host-b's Get with %s's token: %v, want code %v", map[string]string{tokenA: "host-a", tokenB: "host-b"}[tc.token], err, tc.want)
		}
	}
	relay := func(token string) int {
		code, _ := getVia(t, "http://"+b.Addr+"/health", map[string]string{"E2b-Sandbox-Id": idB, "E2b-Sandbox-Port": "49983", "Skiff-Node-Token": token})
		return code
	}
	if code := relay(tokenA); code != http.StatusUnauthorized {
		t.Errorf("host-b's relay with host-a's token: %d, want 401", code)
	}
	if code := relay(tokenB); code/100 != 2 {
		t.Errorf("host-b's relay with its own token: %d", code)
	}
	for node, id := range onNode {
		if code, body := s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNoContent {
			t.Errorf("kill %s's sandbox: %d %s", node, code, body)
		}
	}
}

// getVia sends GET url with headers and returns the status and body.
func getVia(t *testing.T, url string, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
