package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// publishHost mirrors the sandboxd at endpoint with shared/hostinventory and
// server-side-applies its NodeInventory, stamped now, on every change and at
// least every interval, as vk-sandbox does; until stop or the end of the
// test.
func publishHost(t *testing.T, c client.Client, endpoint, token string, interval time.Duration) (stop func()) {
	t.Helper()
	host := hostinventory.New(sandboxdapi.NewClients(token, nil)(endpoint), endpoint, hostinventory.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	wg.Go(func() { _ = host.Run(ctx) })
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if inv, err := host.Inventory(); err == nil {
				inv.PublishedAt = &metav1.Time{Time: time.Now()}
				//nolint:staticcheck // client.Apply with a typed object is how vk-sandbox publishes until it moves to apply configurations.
				if err := c.Patch(ctx, inv, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership); err != nil && ctx.Err() == nil {
					t.Logf("publish NodeInventory: %v", err)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-host.Changed():
			case <-tick.C:
			}
		}
	})
	return stop
}

// newKubeSystem runs sandboxd (as root, with the base template), a real
// kube-apiserver, a publisher of the host's NodeInventory, and
// sandbox-apiserver serve --inventory kube, each built from this workspace;
// keys are made with sandbox-apiserver keys create against the cluster.
func newKubeSystem(t *testing.T) *system {
	t.Helper()
	return newKubeSystemWith(t, kubeSystemOptions{})
}

// kubeSystemOptions change what newKubeSystemWith runs.
type kubeSystemOptions struct {
	// aggregated serves the aggregated API behind an APIService, with
	// sandbox-apiserver run as its ServiceAccount under deploy.RBAC.
	aggregated bool
	// staleAfter is --inventory-stale-after; 0 is the default.
	staleAfter time.Duration
	// secondHost runs a second sandbox host, host-l, with the same token.
	secondHost bool
	// serveArgs are more flags for serve.
	serveArgs []string
	// secondReplica runs a second sandbox-apiserver (without the
	// aggregated API), as a Deployment of two does.
	secondReplica bool
	// kube is set to the parts of the system the kube tests reach.
	kube *kubeSystem
}

// kubeSystem is what the aggregated API's tests reach beyond system.
type kubeSystem struct {
	env *kubetest.Env
	// stopPublishing stops the host's publisher.
	stopPublishing func()
	// apiserver is the sandbox-apiserver binary, and its running daemon.
	apiserver string
	daemon    *hosttest.Daemon
	// admin is serve's --admin-listen.
	admin string
	// second is host-l, with secondHost.
	second *hosttest.Host
	// replica2 is the second sandbox-apiserver, with secondReplica: its
	// daemon, e2b API URL and admin listener.
	replica2                   *hosttest.Daemon
	replica2API, replica2Admin string
}

func newKubeSystemWith(t *testing.T, o kubeSystemOptions) *system {
	t.Helper()
	env := kubetest.StartWith(t, kubetest.Options{Aggregator: o.aggregated})
	h := hosttest.NewHost(t, hosttest.Options{Name: "apik", NodeName: "host-k",
		Build: []string{"github.com/skiff-dev/skiff/apiserver/cmd/sandbox-apiserver"}})
	s := &system{t: t, dir: h.Dir, sandboxd: h.Addr, token: h.Token}
	dir, sbd, token, tokenFile, apiserver := h.Dir, h.Addr, h.Token, h.TokenFile, h.Bins["sandbox-apiserver"]

	// The cluster: teams, the base template (with an alias) and one no
	// host holds, and the host's inventory.
	ctx := t.Context()
	for _, ns := range []string{"team-a", "team-b", deploy.DefaultNamespace} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for name, alias := range map[string]string{"base": "py", "gpu": "cuda"} {
		st := &v1beta1.SandboxTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       v1beta1.SandboxTemplateSpec{Aliases: []string{alias}, Source: v1beta1.TemplateSource{Builtin: "base"}, CPUMilli: 500, MemoryMiB: 256},
		}
		if err := env.Client.Create(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	stopPublishing := publishHost(t, env.Client, sbd, token, 2*time.Second)
	var second *hosttest.Host
	if o.secondHost {
		second = hosttest.NewHost(t, hosttest.Options{Name: "apil", NodeName: "host-l", Token: token})
		publishHost(t, env.Client, second.Addr, token, 2*time.Second)
	}

	kc := env.Kubeconfig(t)
	for _, k := range []*string{&s.keyA, &s.keyB} {
		team := map[*string]string{&s.keyA: "team-a", &s.keyB: "team-b"}[k]
		out, err := exec.Command(apiserver, "keys", "create", "--team", team, "--kubeconfig", kc).Output()
		if err != nil {
			t.Fatalf("keys create --team %s: %v", team, err)
		}
		*k = strings.TrimSpace(string(out))
	}
	s.api = "http://" + hosttest.FreeAddr(t)
	admin := hosttest.FreeAddr(t)
	args := []string{"serve", "--listen", strings.TrimPrefix(s.api, "http://"), "--admin-listen", admin,
		"--inventory", "kube", "--sandboxd-token-file", tokenFile}
	args = append(args, o.serveArgs...)
	if o.staleAfter > 0 {
		args = append(args, "--inventory-stale-after", o.staleAfter.String())
	}
	if o.aggregated {
		args = append(args, installAggregated(t, env, dir)...)
	} else {
		args = append(args, "--kubeconfig", kc, "--secure-port", "0")
	}
	d := hosttest.NewDaemon(t, dir, "apiserver", apiserver, args...)
	d.Start()
	ks := kubeSystem{env: env, stopPublishing: stopPublishing, apiserver: apiserver, daemon: d, admin: admin, second: second}
	if o.secondReplica {
		ks.replica2API, ks.replica2Admin = "http://"+hosttest.FreeAddr(t), hosttest.FreeAddr(t)
		args2 := append([]string{"serve", "--listen", strings.TrimPrefix(ks.replica2API, "http://"), "--admin-listen", ks.replica2Admin,
			"--inventory", "kube", "--sandboxd-token-file", tokenFile, "--kubeconfig", kc, "--secure-port", "0"}, o.serveArgs...)
		ks.replica2 = hosttest.NewDaemon(t, dir, "apiserver-2", apiserver, args2...)
		ks.replica2.Start()
	}
	if o.kube != nil {
		*o.kube = ks
	}
	s.waitForCatalog()
	return s
}

// waitForCatalog waits until the apiserver serves and resolves the base
// template's alias from its SandboxTemplate.
func (s *system) waitForCatalog() {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		code, body := s.call(s.keyA, http.MethodGet, "/templates/aliases/py", nil)
		if code == http.StatusOK && strings.Contains(string(body), `"base"`) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatal("the apiserver never resolved the alias py")
}

func TestKubeModeThroughTheE2BAPI(t *testing.T) {
	s := newKubeSystem(t)

	// Create by alias as team-a. The host's NodeInventory may still be on
	// its way: a create answers 503 until placement sees the host.
	var (
		code int
		body []byte
	)
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body = s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "py", "timeout": 120})
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct {
		SandboxID, ClientID, EnvdAccessToken, TemplateID, Alias string
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	if len(created.SandboxID) != 20 || created.ClientID != "host-k" || created.EnvdAccessToken == "" || created.TemplateID != "base" {
		t.Fatalf("created %s", body)
	}
	id := created.SandboxID
	code, body = s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"state":"running"`) {
		t.Errorf("get: %d %s", code, body)
	}
	// The template's resources, not the fleet's defaults.
	if !strings.Contains(string(body), `"memoryMB":256`) {
		t.Errorf("get: %s, want the template's 256 MiB", body)
	}
	// The sandbox reaches the published inventory, and the list shows it to
	// its team only.
	deadline = time.Now().Add(30 * time.Second)
	for {
		if code, body = s.call(s.keyA, http.MethodGet, "/v2/sandboxes", nil); code == http.StatusOK && strings.Contains(string(body), id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body = s.call(s.keyB, http.MethodGet, "/v2/sandboxes", nil); code != http.StatusOK || strings.Contains(string(body), id) {
		t.Errorf("list by team-b: %d %s", code, body)
	}
	if code, _ = s.call(s.keyB, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("get by team-b: %d", code)
	}
	// A template no host holds: 503 in e2b's shape; an unknown one: 404.
	if code, body = s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "cuda"}); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "sandbox_capacity_unavailable") {
		t.Errorf("create gpu: %d %s", code, body)
	}
	if code, body = s.call(s.keyA, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "no-such"}); code != http.StatusNotFound || !strings.Contains(string(body), "template 'no-such' not found") {
		t.Errorf("create no-such: %d %s", code, body)
	}
	// Kill, then it is gone.
	if code, body = s.call(s.keyA, http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNoContent {
		t.Errorf("kill: %d %s", code, body)
	}
	if code, _ = s.call(s.keyA, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Errorf("get after kill: %d", code)
	}
}
