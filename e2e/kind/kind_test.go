// Package kind runs the fleet lanes (e2e/fleet's A to D, and the SDK suite)
// against a cluster where the Helm chart is installed, as make e2e-kind
// sets one up with kind: a control plane and two sandbox hosts, each a
// Docker container. It takes a kubeconfig and the e2b API's and the proxy's
// URLs, so the checks run against any such cluster; the failures (a host
// frozen, its publisher restarted or stopped, the control plane frozen)
// are made with docker on kind's node containers, and the lanes that need
// them are skipped without SKIFF_KIND_DOCKER=1.
//
// Environment (make e2e-kind sets all of it):
//
//	SKIFF_KIND_KUBECONFIG    the cluster's kubeconfig (required, else the test skips)
//	SKIFF_KIND_API_URL       the e2b API (default http://127.0.0.1:30080)
//	SKIFF_KIND_SANDBOX_URL   the envd proxy (default http://127.0.0.1:30082)
//	SKIFF_KIND_NAMESPACE     the chart's release namespace (default skiff-system)
//	SKIFF_KIND_HOSTS         the two host nodes, A then B (default skiff-e2e-worker,skiff-e2e-worker2)
//	SKIFF_KIND_CONTROL_PLANE the control plane's node (default skiff-e2e-control-plane)
//	SKIFF_KIND_DOCKER        1: make the failures with docker (kind only)
//	SKIFF_FLEET_INTERVAL, SKIFF_FLEET_WINDOW  the chart's freshness values (default 2s, 6s)
//	SKIFF_KIND_NODE_PREFIX   the chart's hosts.nodeNamePrefix (default skiff-)
package kind

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/e2e/internal/charttest"
)

var sandboxesGVR = schema.GroupVersionResource{Group: "sandbox.skiff.dev", Version: "v1beta1", Resource: "sandboxes"}

// The teams: the lanes' and a second one the SDK suite checks isolation
// against.
const team, teamB = "team-kind", "team-kind-b"

// cluster is the cluster under test.
type cluster struct {
	t                *testing.T
	api, proxy       string
	key              string
	admin            client.Client
	dyn              *dynamic.DynamicClient
	kubeconfig       string
	nodes            [2]string // kind node containers of hosts A and B
	vnodes           [2]string // their virtual nodes (and NodeInventories)
	controlPlane     string
	docker           bool
	interval, window time.Duration
	onA, onB         []string
	watchMu          sync.Mutex
	events           []watch.Event
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func duration(t *testing.T, name, def string) time.Duration {
	d, err := time.ParseDuration(env(name, def))
	if err != nil || d <= 0 {
		t.Fatalf("%s: %q is not a duration above 0", name, env(name, def))
	}
	return d
}

func newCluster(t *testing.T) *cluster {
	kc := os.Getenv("SKIFF_KIND_KUBECONFIG")
	if kc == "" {
		t.Skip("SKIFF_KIND_KUBECONFIG is not set: make e2e-kind runs these lanes against a kind cluster with the chart installed")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	hosts := strings.Split(env("SKIFF_KIND_HOSTS", "skiff-e2e-worker,skiff-e2e-worker2"), ",")
	if len(hosts) != 2 {
		t.Fatalf("SKIFF_KIND_HOSTS names %d nodes, want 2", len(hosts))
	}
	prefix := env("SKIFF_KIND_NODE_PREFIX", "skiff-")
	c := &cluster{
		t: t, api: env("SKIFF_KIND_API_URL", "http://127.0.0.1:30080"), proxy: env("SKIFF_KIND_SANDBOX_URL", "http://127.0.0.1:30082"),
		admin: admin, dyn: dynamic.NewForConfigOrDie(cfg), kubeconfig: kc,
		nodes: [2]string{hosts[0], hosts[1]}, vnodes: [2]string{prefix + hosts[0], prefix + hosts[1]},
		controlPlane: env("SKIFF_KIND_CONTROL_PLANE", "skiff-e2e-control-plane"),
		docker:       os.Getenv("SKIFF_KIND_DOCKER") == "1",
		interval:     duration(t, "SKIFF_FLEET_INTERVAL", "2s"), window: duration(t, "SKIFF_FLEET_WINDOW", "6s"),
	}
	c.key = c.apiKey(team)
	return c
}

// apiKey makes ns's namespace and an API key of it with sandbox-apiserver
// keys create.
func (c *cluster) apiKey(ns string) string {
	ctx := c.t.Context()
	if err := c.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatalf("create namespace %s: %v", ns, err)
	}
	out, err := exec.CommandContext(ctx, charttest.Binary(c.t, "sandbox-apiserver"), "keys", "create", "--team", ns, "--kubeconfig", c.kubeconfig).Output()
	if err != nil {
		c.t.Fatalf("keys create --team %s: %v", ns, err)
	}
	return strings.TrimSpace(string(out))
}

// dockerDo runs docker with args on kind's node containers.
func (c *cluster) dockerDo(args ...string) {
	c.t.Helper()
	if out, err := exec.CommandContext(c.t.Context(), "docker", args...).CombinedOutput(); err != nil {
		c.t.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// signalVK sends sig (TERM, STOP, CONT) to the vk-sandbox processes on the
// kind node container node, found by their name in /proc: the node image
// need have nothing but a shell and cat.
func (c *cluster) signalVK(node, sig string) {
	c.t.Helper()
	script := `n=0; for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = vk-sandbox ] && kill -` + sig +
		` "${p#/proc/}" && n=$((n+1)); done; [ "$n" -gt 0 ] || { echo "no vk-sandbox process" >&2; exit 1; }`
	c.dockerDo("exec", node, "sh", "-c", script)
}

// needDocker skips a lane that makes failures when docker may not be used.
func (c *cluster) needDocker(t *testing.T) {
	if !c.docker {
		t.Skip("makes failures with docker on kind's nodes: SKIFF_KIND_DOCKER=1")
	}
}

func (c *cluster) call(method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, c.api+path, rd)
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (c *cluster) create() (id, node string, took time.Duration, err error) {
	start := time.Now()
	code, body := c.call(http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 3600})
	took = time.Since(start)
	if code != http.StatusCreated {
		return "", "", took, fmt.Errorf("create: %d %s", code, body)
	}
	var out struct{ SandboxID, ClientID string }
	err = json.Unmarshal(body, &out)
	return out.SandboxID, out.ClientID, took, err
}

func (c *cluster) e2bList() (map[string]bool, error) {
	code, body := c.call(http.MethodGet, "/v2/sandboxes?limit=100", nil)
	if code != http.StatusOK {
		return nil, fmt.Errorf("e2b list: %d %s", code, body)
	}
	var list []struct{ SandboxID string }
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, sb := range list {
		out[sb.SandboxID] = true
	}
	return out, nil
}

func (c *cluster) kubeList() (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := c.dyn.Resource(sandboxesGVR).Namespace(team).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, it := range list.Items {
		out[it.GetName()] = true
	}
	return out, nil
}

// listed is "" when the e2b list and the kube list both show all of ids
// (want) or none of them (!want), else what differs.
func (c *cluster) listed(ids []string, want bool) string {
	e2b, err := c.e2bList()
	if err != nil {
		return err.Error()
	}
	kube, err := c.kubeList()
	if err != nil {
		return "kube list: " + err.Error()
	}
	var bad []string
	for _, id := range ids {
		if e2b[id] != want {
			bad = append(bad, fmt.Sprintf("e2b %s=%v", id, e2b[id]))
		}
		if kube[id] != want {
			bad = append(bad, fmt.Sprintf("kube %s=%v", id, kube[id]))
		}
	}
	return strings.Join(bad[:min(len(bad), 4)], ", ")
}

func (c *cluster) eventually(within time.Duration, what string, cond func() string) time.Duration {
	c.t.Helper()
	start := time.Now()
	for {
		msg := cond()
		if msg == "" {
			return time.Since(start)
		}
		if time.Since(start) > within {
			c.t.Fatalf("%s: not within %s: %s", what, within, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) publishedAt(i int) time.Time {
	var inv v1beta1.NodeInventory
	if err := c.admin.Get(c.t.Context(), client.ObjectKey{Name: c.vnodes[i]}, &inv); err != nil || inv.PublishedAt == nil {
		c.t.Fatalf("NodeInventory %s: %v (publishedAt %v)", c.vnodes[i], err, inv.PublishedAt)
	}
	return inv.PublishedAt.Time
}

// watch records every sandbox watch event of team.
func (c *cluster) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	wi, err := c.dyn.Resource(sandboxesGVR).Namespace(team).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		c.t.Fatalf("watch sandboxes: %v", err)
	}
	done := make(chan struct{})
	c.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			c.watchMu.Lock()
			c.events = append(c.events, ev)
			c.watchMu.Unlock()
		}
	}()
}

func (c *cluster) eventCount() int {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	return len(c.events)
}

func (c *cluster) eventsSince(i int) []watch.Event {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	return slices.Clone(c.events[min(i, len(c.events)):])
}

func lineOK(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	status := "PASS"
	if !ok {
		status = "FAIL"
		t.Errorf(format, args...)
	}
	fmt.Printf("%s %s: %s\n", status, t.Name(), fmt.Sprintf(format, args...))
}

// TestKindLanes is make e2e-kind's suite.
func TestKindLanes(t *testing.T) {
	c := newCluster(t)
	c.watch()
	// 7 of team's sandboxes on B, the rest on A.
	for i := 0; len(c.onB) < 7; i++ {
		if i >= 42 {
			t.Fatalf("%d creates put %d sandboxes on %s", i, len(c.onB), c.vnodes[1])
		}
		id, node, _, err := c.create()
		if err != nil {
			t.Fatal(err)
		}
		if node == c.vnodes[1] {
			c.onB = append(c.onB, id)
		} else {
			c.onA = append(c.onA, id)
		}
	}
	t.Cleanup(func() {
		for _, id := range append(slices.Clone(c.onA), c.onB...) {
			c.call(http.MethodDelete, "/sandboxes/"+id, nil)
		}
	})
	t.Run("A", c.laneA)
	t.Run("B", c.laneB)
	t.Run("C", c.laneC)
	t.Run("D", c.laneD)
	t.Run("SDK", c.sdk)
}

// laneA: host B frozen whole (docker pause of its node: sandboxd,
// vk-sandbox and its kubelet stop answering, as a hung or cut-off host),
// then thawed.
func (c *cluster) laneA(t *testing.T) {
	t.Run("A-01", func(t *testing.T) {
		msg := c.eventually(time.Minute, "B's sandboxes listed", func() string { return c.listed(c.onB, true) })
		lineOK(t, true, "%d sandboxes of %s in the e2b and kube lists (after %s)", len(c.onB), c.vnodes[1], msg.Round(time.Millisecond))
	})
	var baseline []time.Duration
	t.Run("A-02", func(t *testing.T) {
		nodes := map[string]int{}
		for range 30 {
			id, node, d, err := c.create()
			if err != nil {
				t.Fatal(err)
			}
			nodes[node]++
			baseline = append(baseline, d)
			c.call(http.MethodDelete, "/sandboxes/"+id, nil)
		}
		lineOK(t, len(nodes) == 2, "30 creates: p50 %s over %v", p50(baseline), nodes)
	})
	c.needDocker(t)
	c.dockerDo("pause", c.nodes[1])
	paused := true
	t.Cleanup(func() {
		if paused {
			c.dockerDo("unpause", c.nodes[1])
		}
	})
	last := c.publishedAt(1)
	events := c.eventCount()
	t.Run("A-03", func(t *testing.T) {
		c.eventually(c.window+c.interval+time.Minute, "B's sandboxes gone from both lists", func() string { return c.listed(c.onB, false) })
		gone := time.Since(last)
		lineOK(t, gone >= c.window && gone <= c.window+c.interval+5*time.Second,
			"B's sandboxes left both lists %s after its last publish (window %s, interval %s)", gone.Round(100*time.Millisecond), c.window, c.interval)
	})
	t.Run("A-04", func(t *testing.T) {
		deleted := map[string]bool{}
		for _, ev := range c.eventsSince(events) {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type == watch.Deleted {
				deleted[u.GetName()] = true
			}
		}
		missing := slices.DeleteFunc(slices.Clone(c.onB), func(id string) bool { return deleted[id] })
		lineOK(t, len(missing) == 0, "DELETED for %d of %d of B's sandboxes (missing %v)", len(c.onB)-len(missing), len(c.onB), missing)
	})
	t.Run("A-05", func(t *testing.T) {
		get, _ := c.call(http.MethodGet, "/sandboxes/"+c.onB[0], nil)
		del, _ := c.call(http.MethodDelete, "/sandboxes/"+c.onB[0], nil)
		lineOK(t, get == http.StatusNotFound && del == http.StatusNotFound, "GET %d, DELETE %d of a sandbox of B", get, del)
	})
	t.Run("A-06", func(t *testing.T) {
		var took []time.Duration
		onB := 0
		for range 30 {
			id, node, d, err := c.create()
			if err != nil {
				t.Fatal(err)
			}
			if node == c.vnodes[1] {
				onB++
			}
			took = append(took, d)
			c.call(http.MethodDelete, "/sandboxes/"+id, nil)
		}
		lineOK(t, onB == 0 && p50(took) <= 2*p50(baseline)+50*time.Millisecond && slices.Max(took) < 10*time.Second,
			"30 creates after the window: %d on B, p50 %s (baseline %s), slowest %s", onB, p50(took), p50(baseline), slices.Max(took))
	})
	t.Run("A-07", func(t *testing.T) {
		bad, slowest := 0, time.Duration(0)
		for i := range 20 {
			start := time.Now()
			code := proxyGet(c.proxy, fmt.Sprintf("unknown%013d", i))
			slowest = max(slowest, time.Since(start))
			if code != http.StatusBadGateway {
				bad++
			}
		}
		lineOK(t, bad == 0 && slowest < time.Second, "20 proxy requests for unknown IDs: %d not 502, slowest %s", bad, slowest)
	})
	// A-08 (no connection attempt reaches B's sandboxd) counts SYNs in B's
	// namespace, which the local lanes own and a cluster does not: not here.
	t.Run("A-09", func(t *testing.T) {
		c.dockerDo("unpause", c.nodes[1])
		paused = false
		back := c.eventually(c.window+time.Minute, "B's sandboxes back in both lists", func() string { return c.listed(c.onB[1:], true) })
		lineOK(t, back <= 2*c.interval+5*time.Second, "B's sandboxes back in both lists %s after its thaw", back.Round(100*time.Millisecond))
	})
	c.onB = c.onB[1:] // A-05 killed the first
}

// quiet watches for events and list gaps of B's sandboxes for d.
func (c *cluster) quiet(d time.Duration) (gaps int) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if c.listed(c.onB, true) != "" {
			gaps++
		}
		time.Sleep(200 * time.Millisecond)
	}
	return gaps
}

// laneB: B's vk-sandbox restarted (SIGTERM; the kubelet starts its
// container again).
func (c *cluster) laneB(t *testing.T) {
	c.needDocker(t)
	c.eventually(time.Minute, "B's sandboxes listed", func() string { return c.listed(c.onB, true) })
	time.Sleep(2 * c.interval) // the opening burst
	events := c.eventCount()
	c.signalVK(c.nodes[1], "TERM")
	gaps := c.quiet(c.window + 2*c.interval)
	t.Run("B-01", func(t *testing.T) {
		n := len(c.eventsSince(events))
		lineOK(t, gaps == 0 && n == 0, "vk-sandbox restarted: %d list gaps, %d watch events over %s", gaps, n, c.window+2*c.interval)
	})
}

// laneC: B's inventory written without publishedAt while its vk-sandbox is
// stopped (SIGSTOP), as a publisher from before the field would.
func (c *cluster) laneC(t *testing.T) {
	c.needDocker(t)
	c.signalVK(c.nodes[1], "STOP")
	t.Cleanup(func() { c.signalVK(c.nodes[1], "CONT") })
	var inv v1beta1.NodeInventory
	if err := c.admin.Get(t.Context(), client.ObjectKey{Name: c.vnodes[1]}, &inv); err != nil {
		t.Fatal(err)
	}
	inv.PublishedAt = nil
	if err := c.admin.Update(t.Context(), &inv); err != nil {
		t.Fatal(err)
	}
	gaps := c.quiet(c.window + 2*c.interval)
	t.Run("C-01", func(t *testing.T) {
		lineOK(t, gaps == 0, "an inventory without publishedAt: %d list gaps over %s", gaps, c.window+2*c.interval)
	})
}

// laneD: the control plane frozen (docker pause of its node) for longer
// than the window and the warm-pool lease.
func (c *cluster) laneD(t *testing.T) {
	c.needDocker(t)
	all := append(slices.Clone(c.onA), c.onB...)
	c.eventually(time.Minute, "every sandbox listed", func() string { return c.listed(all, true) })
	c.dockerDo("pause", c.controlPlane)
	paused := true
	t.Cleanup(func() {
		if paused {
			c.dockerDo("unpause", c.controlPlane)
		}
	})
	outage := c.window + 20*time.Second // the chart's lease is 15 s
	gaps, polls := 0, 0
	deadline := time.Now().Add(outage)
	for time.Now().Before(deadline) {
		got, err := c.e2bList()
		polls++
		if err != nil || slices.ContainsFunc(all, func(id string) bool { return !got[id] }) {
			gaps++
		}
		time.Sleep(500 * time.Millisecond)
	}
	id, _, _, err := c.create()
	c.dockerDo("unpause", c.controlPlane)
	paused = false
	t.Run("D-01", func(t *testing.T) {
		lineOK(t, gaps == 0 && err == nil, "control plane frozen %s: %d of %d e2b lists missed a sandbox; a create during it: %s", outage, gaps, polls, errOr(err, "201"))
	})
	if id != "" {
		c.call(http.MethodDelete, "/sandboxes/"+id, nil)
	}
	c.eventually(2*time.Minute, "every sandbox listed after the outage", func() string { return c.listed(all, true) })
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

// sdk runs the unmodified e2b SDK suite (e2e/sdk) against the cluster.
func (c *cluster) sdk(t *testing.T) {
	dir := filepath.Join(charttest.Repo(t), "e2e", "sdk")
	cmd := exec.CommandContext(t.Context(), "node", "--test", "--test-concurrency=1", "sdk.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+c.api, "E2B_VOLUME_API_URL="+c.api, "E2B_SANDBOX_URL="+c.proxy, "E2B_API_KEY="+c.key, "SKIFF_API_KEY_B="+c.apiKey(teamB))
	out, err := cmd.CombinedOutput()
	lineOK(t, err == nil, "the e2b SDK suite against the cluster: %s", errOr(err, "passed"))
	if err != nil {
		t.Logf("%s", out)
	}
}

func proxyGet(proxy, id string) int {
	req, _ := http.NewRequest(http.MethodGet, proxy+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
