// Package fleetenv is what the fleet lanes (e2e/fleet) and the fleet
// simulator (e2e/internal/fleetbench) both do to run the fleet's readers —
// sandbox-apiserver and sandbox-envd-proxy — on a local control plane
// (shared/testing/kubetest): the replicas' service-account kubeconfig,
// the teams' API keys, the freshness flags, and the requests that ask
// them whether a sandbox is routed.
package fleetenv

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// ServiceAccountKubeconfig returns a kubeconfig of sandbox-apiserver's
// service account (deploy.RBAC's rights, installed by deploy's Install*),
// with a token valid for two hours.
func ServiceAccountKubeconfig(t testing.TB, env *kubetest.Env) string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tok, err := cs.CoreV1().ServiceAccounts(deploy.DefaultNamespace).CreateToken(t.Context(), deploy.DefaultName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(7200))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return kubetest.WriteKubeconfig(t, &rest.Config{Host: env.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: tok.Status.Token})
}

// APIKey makes a key of team with `sandbox-apiserver keys create` (the
// binary in bins), as an operator does, through kubeconfig.
func APIKey(t testing.TB, bins, kubeconfig, team string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(bins, "sandbox-apiserver"), "keys", "create", "--team", team, "--kubeconfig", kubeconfig).Output()
	if err != nil {
		t.Fatalf("keys create --team %s: %v", team, err)
	}
	return strings.TrimSpace(string(out))
}

// FreshnessFlags are the readers' freshness filter flags: the stale
// window and the hosts' publish interval.
func FreshnessFlags(interval, window time.Duration) []string {
	return []string{"--inventory-stale-after", window.String(), "--inventory-publish-interval", interval.String()}
}

// ProxyHealth asks the envd proxy at proxyURL for envd's /health in
// sandbox id (by E2b-Sandbox-Id and E2b-Sandbox-Port) and returns the
// status code (0 when the request failed) and how long it took.
func ProxyHealth(proxyURL, id string) (int, time.Duration) {
	code, _, took := ProxyHealthBody(proxyURL, id)
	return code, took
}

// ProxyHealthBody is ProxyHealth with the answer's body, which tells the
// proxy's two 502s apart: a sandbox on no fresh node (e2b's "not found",
// no traffic to any node) and a routed request whose node did not answer.
func ProxyHealthBody(proxyURL, id string) (int, []byte, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, proxyURL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, time.Since(start)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return resp.StatusCode, body, time.Since(start)
}

// HTTPCode is the status of a GET of url, 0 when it failed.
func HTTPCode(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}
