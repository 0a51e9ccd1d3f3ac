package cli

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

func createNamespaces(t testing.TB, c client.Client, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatalf("create namespace %s: %v", name, err)
		}
	}
}

// keysCreate runs `keys create --team team --kubeconfig kc` and returns the
// printed key and the Secret it names on stderr.
func keysCreate(t testing.TB, kc, team string) (key string, secret client.ObjectKey) {
	t.Helper()
	out, diag, err := runSplit(t, "keys", "create", "--team", team, "--kubeconfig", kc)
	if err != nil {
		t.Fatalf("keys create --team %s: %v", team, err)
	}
	key = strings.TrimSpace(out)
	if !auth.ValidKey(key) {
		t.Fatalf("keys create printed %q on stdout, not a key", out)
	}
	// "created Secret <ns>/<name> (…)"
	f := strings.Fields(diag)
	if len(f) < 3 || f[0] != "created" || f[1] != "Secret" {
		t.Fatalf("keys create wrote %q on stderr, want the Secret's name", diag)
	}
	ns, name, _ := strings.Cut(f[2], "/")
	return key, client.ObjectKey{Namespace: ns, Name: name}
}

// `keys create` without --api-keys-file makes a Secret in the team's
// namespace that holds the key's digest and nothing from which the key can
// be read; a team without a namespace is a clear error.
func TestKeysCreateInKubernetes(t *testing.T) {
	env := kubetest.Start(t)
	kc := kubetest.WriteKubeconfig(t, env.Config)
	createNamespaces(t, env.Client, "team-a")

	key, ref := keysCreate(t, kc, "team-a")
	if ref.Namespace != "team-a" || !strings.HasPrefix(ref.Name, auth.SecretGenerateName) {
		t.Fatalf("Secret %v, want team-a/%s…", ref, auth.SecretGenerateName)
	}
	var sec corev1.Secret
	if err := env.Client.Get(t.Context(), ref, &sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.Data) != 1 || string(sec.Data[auth.SecretDigestField]) != auth.Hash(key) {
		t.Errorf("Secret data = %q, want only %s = the key's digest", sec.Data, auth.SecretDigestField)
	}
	if _, ok := sec.Labels[auth.LabelAPIKey]; !ok {
		t.Errorf("Secret labels = %v, want %s", sec.Labels, auth.LabelAPIKey)
	}
	whole, err := json.Marshal(&sec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(whole), key[len(auth.KeyPrefix):]) {
		t.Errorf("the Secret holds the key itself: %s", whole)
	}

	// With $KUBECONFIG instead of --kubeconfig.
	t.Setenv("KUBECONFIG", kc)
	if _, _, err := runSplit(t, "keys", "create", "--team", "team-a"); err != nil {
		t.Errorf("keys create with $KUBECONFIG: %v", err)
	}

	out, _, err := runSplit(t, "keys", "create", "--team", "team-z", "--kubeconfig", kc)
	if err == nil || !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), `team "team-z" has no namespace`) {
		t.Errorf("keys create for a team without a namespace = %v", err)
	}
	if out != "" {
		t.Errorf("a failed keys create printed %q", out)
	}
}

// fleet objects for TestKubeMode, with their nodes' tags (readers ignore
// an entry whose ID has another node's, see inventory.Owned).
var (
	idA1 = "aaaaaaaaaaaaaaaa" + string(sandboxid.NodeTag("node-fresh")) // team-a, on the fresh node
	idB1 = "bbbbbbbbbbbbbbbb" + string(sandboxid.NodeTag("node-fresh")) // team-b, on the fresh node
	idW1 = "wwwwwwwwwwwwwwww" + string(sandboxid.NodeTag("node-fresh")) // warm, on the fresh node
	idA2 = "aaaaaaaaaaaaaaaa" + string(sandboxid.NodeTag("node-stale")) // team-a, on the stale node
)

func sandboxTemplate(name string, aliases []string, cpuMilli, memMiB int64) *v1beta1.SandboxTemplate {
	return &v1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.SandboxTemplateSpec{
			Aliases:   aliases,
			Source:    v1beta1.TemplateSource{Builtin: "base"},
			CPUMilli:  cpuMilli,
			MemoryMiB: memMiB,
		},
	}
}

// publish server-side-applies a NodeInventory of a host at endpoint,
// stamped at, as vk-sandbox does.
func publish(t testing.TB, c client.Client, name, endpoint string, at time.Time, templates []string, sandboxes ...v1beta1.SandboxEntry) {
	t.Helper()
	if err := tryPublish(t.Context(), c, name, endpoint, at, templates, sandboxes...); err != nil {
		t.Fatalf("publish %s: %v", name, err)
	}
}

// tryPublish is publish, returning the kube-apiserver's answer.
func tryPublish(ctx context.Context, c client.Client, name, endpoint string, at time.Time, templates []string, sandboxes ...v1beta1.SandboxEntry) error {
	inv := &v1beta1.NodeInventory{
		TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta:  metav1.ObjectMeta{Name: name},
		PublishedAt: &metav1.Time{Time: at},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint:  endpoint,
			Capacity:  v1beta1.NodeCapacity{CPUMilli: 8000, MemoryMiB: 16384, Sandboxes: 10},
			Sandboxes: sandboxes,
		},
	}
	for _, tm := range templates {
		inv.Spec.Templates = append(inv.Spec.Templates, v1beta1.TemplateVersion{Name: tm, Version: "v1"})
	}
	//nolint:staticcheck // client.Apply with a typed object is how vk-sandbox publishes until it moves to apply configurations.
	return c.Patch(ctx, inv, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership)
}

func entry(id, team string, state v1beta1.SandboxState) v1beta1.SandboxEntry {
	return v1beta1.SandboxEntry{ID: id, Template: "base", State: state, Team: team, StartedAt: v1beta1.NewMicroTime(time.Now()), CPUMilli: 1000, MemoryMiB: 512}
}

// api calls the e2b API at base with key.
type api struct {
	t    *testing.T
	base string
}

func (a api) call(key, method, path, body string) (int, []byte) {
	a.t.Helper()
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.base+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(auth.HeaderAPIKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// sandboxIDs lists the key's sandboxes (GET /v2/sandboxes); nil on a
// status other than 200, which goes to the returned code.
func (a api) sandboxIDs(key string) ([]string, int) {
	a.t.Helper()
	code, body := a.call(key, http.MethodGet, "/v2/sandboxes", "")
	if code != http.StatusOK {
		return nil, code
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		a.t.Fatalf("list: %v: %s", err, body)
	}
	ids := make([]string, 0, len(list))
	for _, s := range list {
		ids = append(ids, s.SandboxID)
	}
	slices.Sort(ids)
	return ids, code
}

// eventually polls cond until it holds, for at most 30 s: the cache follows
// the kube-apiserver asynchronously.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The wiring serve --inventory kube runs (newApp, from parsed flags),
// against a real kube-apiserver: keys are Secrets made by `keys create`,
// the fleet is the fresh NodeInventories, templates are SandboxTemplates.
func TestKubeMode(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	c := env.Client
	kc := kubetest.WriteKubeconfig(t, env.Config)
	createNamespaces(t, c, "team-a", "team-b")

	keyA, secretA := keysCreate(t, kc, "team-a")
	keyB, _ := keysCreate(t, kc, "team-b")
	// A Secret that is no API key: the cache must not hold it.
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db-password"},
		StringData: map[string]string{"password": "hunter2"},
	}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*v1beta1.SandboxTemplate{
		sandboxTemplate("base", []string{"python", "py3"}, 1500, 768),
		sandboxTemplate("go", []string{"golang"}, 0, 0), // the CRD's defaults: 1000m, 512 MiB
		sandboxTemplate("node", []string{"js"}, 1000, 512),
		sandboxTemplate("deno", []string{"js"}, 1000, 512), // js is claimed twice
	} {
		if err := c.Create(ctx, st); err != nil {
			t.Fatalf("create SandboxTemplate %s: %v", st.Name, err)
		}
	}
	// No sandboxd runs in this test. The stale node's endpoint is a
	// listener that counts what reaches it: nothing may.
	var staleHits atomic.Int64
	stale := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		staleHits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(stale.Close)
	staleEndpoint := strings.TrimPrefix(stale.URL, "http://")
	now := time.Now()
	// Only the stale node holds go; it published 10 minutes before the
	// fresh one (the window is 90 s).
	publish(t, c, "node-fresh", "127.0.0.1:1", now, []string{"base"},
		entry(idA1, "team-a", v1beta1.SandboxRunning), entry(idB1, "team-b", v1beta1.SandboxPaused), entry(idW1, "", v1beta1.SandboxWarm))
	publish(t, c, "node-stale", staleEndpoint, now.Add(-10*time.Minute), []string{"base", "go"}, entry(idA2, "team-a", v1beta1.SandboxRunning))

	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("node-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := parseServe(t, "--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", token, "--listen", "127.0.0.1:0")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	app, err := newApp(ctx, o, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatalf("newApp: %v", err)
	}
	t.Cleanup(app.stop)
	srv := httptest.NewServer(app.handler)
	t.Cleanup(srv.Close)
	a := api{t: t, base: srv.URL}

	t.Run("the cache holds API-key Secrets only", func(t *testing.T) {
		var secrets corev1.SecretList
		if err := app.kube.cache.List(ctx, &secrets); err != nil {
			t.Fatal(err)
		}
		if len(secrets.Items) != 2 {
			t.Errorf("cached Secrets = %d, want the 2 API keys", len(secrets.Items))
		}
		for _, s := range secrets.Items {
			if _, ok := s.Labels[auth.LabelAPIKey]; !ok {
				t.Errorf("the cache holds Secret %s/%s, which is no API key", s.Namespace, s.Name)
			}
		}
	})

	t.Run("health needs no key", func(t *testing.T) {
		if code, body := a.call("", http.MethodGet, "/health", ""); code != http.StatusOK {
			t.Errorf("GET /health = %d %s", code, body)
		}
	})

	t.Run("lists come from fresh nodes, by the key's team", func(t *testing.T) {
		if ids, code := a.sandboxIDs(keyA); !slices.Equal(ids, []string{idA1}) {
			t.Errorf("team-a lists %v (%d), want [%s]: not the stale node's %s", ids, code, idA1, idA2)
		}
		if ids, code := a.sandboxIDs(keyB); !slices.Equal(ids, []string{idB1}) {
			t.Errorf("team-b lists %v (%d), want [%s]", ids, code, idB1)
		}
		if _, code := a.sandboxIDs("e2b_" + strings.Repeat("0", 40)); code != http.StatusUnauthorized {
			t.Errorf("an unknown key lists: %d, want 401", code)
		}
	})

	t.Run("templates are the SandboxTemplates", func(t *testing.T) {
		for _, path := range []string{"/templates", "/v2/templates"} {
			code, body := a.call(keyA, http.MethodGet, path, "")
			if code != http.StatusOK {
				t.Fatalf("GET %s = %d %s", path, code, body)
			}
			var ts []struct {
				TemplateID  string   `json:"templateID"`
				Aliases     []string `json:"aliases"`
				CPUCount    int      `json:"cpuCount"`
				MemoryMB    int      `json:"memoryMB"`
				DiskSizeMB  int      `json:"diskSizeMB"`
				EnvdVersion string   `json:"envdVersion"`
			}
			if err := json.Unmarshal(body, &ts); err != nil {
				t.Fatalf("GET %s: %v: %s", path, err, body)
			}
			var ids []string
			for _, tm := range ts {
				ids = append(ids, tm.TemplateID)
			}
			// go is listed although no fresh node holds it.
			if want := []string{"base", "deno", "go", "node"}; !slices.Equal(ids, want) {
				t.Fatalf("GET %s lists %v, want %v", path, ids, want)
			}
			base, goT := ts[0], ts[2]
			if !slices.Equal(base.Aliases, []string{"python", "py3"}) || base.CPUCount != 2 || base.MemoryMB != 768 || base.DiskSizeMB != 1024 || base.EnvdVersion != "0.6.0" {
				t.Errorf("GET %s: base = %+v", path, base)
			}
			if goT.CPUCount != 1 || goT.MemoryMB != 512 {
				t.Errorf("GET %s: go = %+v, want the CRD's defaults", path, goT)
			}
		}
		code, body := a.call(keyA, http.MethodGet, "/templates/base", "")
		if code != http.StatusOK || !strings.Contains(string(body), `"templateID":"base"`) || !strings.Contains(string(body), `"builds":[{`) {
			t.Errorf("GET /templates/base = %d %s", code, body)
		}
		if code, body := a.call(keyA, http.MethodGet, "/templates/nope", ""); code != http.StatusNotFound {
			t.Errorf("GET /templates/nope = %d %s", code, body)
		}
	})

	t.Run("aliases resolve to their template", func(t *testing.T) {
		for alias, want := range map[string]string{"python": "base", "py3": "base", "golang": "go", "base": "base"} {
			code, body := a.call(keyA, http.MethodGet, "/templates/aliases/"+alias, "")
			var got struct {
				TemplateID string `json:"templateID"`
			}
			if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got.TemplateID != want {
				t.Errorf("GET /templates/aliases/%s = %d %s, want %s", alias, code, body, want)
			}
		}
		if code, body := a.call(keyA, http.MethodGet, "/templates/aliases/ruby", ""); code != http.StatusNotFound {
			t.Errorf("GET /templates/aliases/ruby = %d %s, want 404", code, body)
		}
		code, body := a.call(keyA, http.MethodGet, "/templates/aliases/js", "")
		if code != http.StatusBadRequest || !strings.Contains(string(body), "deno, node") {
			t.Errorf("GET /templates/aliases/js (claimed twice) = %d %s, want 400 naming both", code, body)
		}
	})

	t.Run("creates: unknown template 404, one no fresh node holds 503", func(t *testing.T) {
		for _, name := range []string{"go", "golang"} {
			code, body := a.call(keyA, http.MethodPost, "/v2/sandboxes", `{"templateID":"`+name+`"}`)
			if code != http.StatusServiceUnavailable || !strings.Contains(string(body), `"error_code":"sandbox_capacity_unavailable"`) {
				t.Errorf("create %s (only on a stale node) = %d %s, want 503 sandbox_capacity_unavailable", name, code, body)
			}
		}
		code, body := a.call(keyA, http.MethodPost, "/v2/sandboxes", `{"templateID":"ruby"}`)
		if code != http.StatusNotFound || !strings.Contains(string(body), "template 'ruby' not found") {
			t.Errorf("create ruby (no such template) = %d %s, want e2b's 404", code, body)
		}
		if n := staleHits.Load(); n != 0 {
			t.Errorf("the stale node's endpoint got %d requests", n)
		}
	})

	t.Run("a node that publishes again is back", func(t *testing.T) {
		publish(t, c, "node-stale", staleEndpoint, time.Now(), []string{"base", "go"}, entry(idA2, "team-a", v1beta1.SandboxRunning))
		eventually(t, "team-a lists the republished node's sandbox", func() bool {
			ids, _ := a.sandboxIDs(keyA)
			return slices.Equal(ids, slices.Sorted(slices.Values([]string{idA1, idA2})))
		})
	})

	t.Run("a deleted key Secret is refused", func(t *testing.T) {
		if err := c.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretA.Namespace, Name: secretA.Name}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "team-a's key is refused", func() bool {
			_, code := a.sandboxIDs(keyA)
			return code == http.StatusUnauthorized
		})
		if ids, code := a.sandboxIDs(keyB); !slices.Equal(ids, []string{idB1}) {
			t.Errorf("team-b lists %v (%d) after team-a's key went", ids, code)
		}
	})
}

// A cluster without the skiff.dev CRDs fails newApp at once, saying so.
func TestKubeModeWithoutTheCRDs(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "sandboxtemplates.skiff.dev"}}
	if err := c.Delete(ctx, crd); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CRD is gone", func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(crd), crd))
	})
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("node-token-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := parseServe(t, "--inventory", "kube", "--kubeconfig", kubetest.WriteKubeconfig(t, env.Config), "--sandboxd-token-file", token)
	app, err := newApp(ctx, o, slog.New(slog.DiscardHandler), nil)
	if err == nil {
		app.stop()
		t.Fatal("newApp succeeded without the SandboxTemplate CRD")
	}
	if !strings.Contains(err.Error(), "CRDs (api/crds) are not installed") || !strings.Contains(err.Error(), "SandboxTemplate") {
		t.Errorf("newApp = %v, want it to name the missing CRD", err)
	}
}

// A server that may not list what it watches (no RBAC) gives up after
// --cache-sync-timeout with an error that says what to check, and leaves
// nothing running.
func TestKubeModeCacheSyncTimeout(t *testing.T) {
	env := kubetest.Start(t)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "no-rbac"}
	kc := kubetest.WriteKubeconfig(t, cfg)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("node-token-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := parseServe(t, "--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", token, "--cache-sync-timeout", "2s")
	app, err := newApp(t.Context(), o, slog.New(slog.DiscardHandler), nil)
	if err == nil {
		app.stop()
		t.Fatal("newApp succeeded for a user that may list nothing")
	}
	t.Logf("newApp = %v", err)
	for _, want := range []string{"did not sync within 2s", "--cache-sync-timeout", "list and watch"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("newApp = %v, want it to mention %q", err, want)
		}
	}
}

// An unreachable cluster fails newApp with an error naming it, rather than
// a server that answers nothing.
func TestKubeModeWithoutACluster(t *testing.T) {
	kc := kubetest.WriteKubeconfig(t, &rest.Config{Host: "https://127.0.0.1:1"})
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("node-token-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := parseServe(t, "--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", token, "--cache-sync-timeout", "5s")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	app, err := newApp(ctx, o, slog.New(slog.DiscardHandler), nil)
	if err == nil {
		app.stop()
		t.Fatal("newApp succeeded without a cluster")
	}
	if !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("newApp = %v, want the cluster named", err)
	}
	t.Logf("newApp = %v", err)
}
