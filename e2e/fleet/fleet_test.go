// Package fleet runs Skiff's fleet on one machine and puts it through the
// failures the freshness contract is about (the lanes, lanes_test.go): a
// real etcd and kube-apiserver with the aggregator; hosts k1-a and k1-b,
// each a network namespace of its own with its own address, running its
// own sandboxd and vk-sandbox (which reaches the control plane through a
// relay the test can cut); two sandbox-apiserver replicas, leader election
// on, behind the v1beta1.sandbox.skiff.dev APIService (a selector-less
// Service and its EndpointSlice, --enable-aggregator-routing); one
// sandbox-envd-proxy; a SandboxTemplate base and a SandboxWarmPool of 4.
//
// The publish interval and the stale window are SKIFF_FLEET_INTERVAL and
// SKIFF_FLEET_WINDOW (2s and 6s by default, as in make test; make
// e2e-full runs 30s and 90s). Every component's log goes to one folder per
// run, named in the output and kept; everything else the fleet makes
// (processes, namespaces, rules, cgroups, files) is gone when the test
// ends, also when it fails or is interrupted.
package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/policies"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/e2e/internal/charttest"
	"github.com/skiff-dev/skiff/e2e/internal/fleetenv"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// Host names, and the team and pool namespaces.
const (
	hostA, hostB = "k1-a", "k1-b"
	team, teamB  = "team-a", "team-b"
	poolNS       = "pools"
	warmReplicas = 4
)

var sandboxesGVR = schema.GroupVersionResource{Group: "sandbox.skiff.dev", Version: "v1beta1", Resource: "sandboxes"}

// config is what a fleet runs with.
type config struct {
	// interval is vk-sandbox's --publish-interval, window the readers'
	// --inventory-stale-after.
	interval, window time.Duration
	// lease is the warm-pool Lease's duration (renew deadline and retry
	// period follow from it).
	lease time.Duration
	// sharedVolumes, if set, is a folder both hosts keep their volumes in,
	// as a shared store (sandboxd --volume-shared).
	sharedVolumes string
	// fullHost, if set, names a host whose disk is below its reserve
	// (sandboxd --disk-reserve past any disk).
	fullHost string
}

// configFromEnv reads SKIFF_FLEET_INTERVAL and SKIFF_FLEET_WINDOW.
func configFromEnv(t *testing.T) config {
	t.Helper()
	c := config{interval: 2 * time.Second, window: 6 * time.Second}
	for env, d := range map[string]*time.Duration{"SKIFF_FLEET_INTERVAL": &c.interval, "SKIFF_FLEET_WINDOW": &c.window} {
		if v := os.Getenv(env); v != "" {
			var err error
			if *d, err = time.ParseDuration(v); err != nil {
				t.Fatalf("%s: %v", env, err)
			}
		}
	}
	if c.window < 2*c.interval {
		t.Fatalf("SKIFF_FLEET_WINDOW (%s) must be at least two SKIFF_FLEET_INTERVAL (%s)", c.window, c.interval)
	}
	// Short enough that an outage of a window outlasts it.
	c.lease = max(4*time.Second, min(15*time.Second, c.window*2/3))
	return c
}

// fleet is a running fleet.
type fleet struct {
	t   *testing.T
	cfg config
	// logs is the run's log folder.
	logs string
	env  *kubetest.Env
	// admin reaches the control plane as its admin (deploy's scheme and
	// Skiff's types), dyn as a dynamic client.
	admin client.Client
	dyn   dynamic.Interface
	kc    string
	hosts map[string]*host
	// replicas are the sandbox-apiserver replicas.
	replicas []*replica
	// proxy is sandbox-envd-proxy; proxyURL its listener (E2B_SANDBOX_URL).
	proxy              *hosttest.Daemon
	proxyURL, proxyAdm string
	key, keyB          string // team-a's and team-b's API keys
	bins               string // SKIFF_BIN
	// stop is closed on SIGINT or SIGTERM.
	stop <-chan struct{}
}

// host is one sandbox host.
type host struct {
	name string
	ns   *hosttest.Netns
	h    *hosttest.Host
	vk   *hosttest.Daemon
	// kube relays vk-sandbox's control-plane connections (cut it to refuse
	// the host's writes while the readers stay connected).
	kube *hosttest.Forwarder
}

// replica is one sandbox-apiserver.
type replica struct {
	name       string
	d          *hosttest.Daemon
	api, admin string
}

// logf prints a line to the test's output at once (also without -v), as
// the lanes' PASS/FAIL lines are.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// newFleet starts the fleet and waits until both hosts are listed, the
// APIService is Available and the warm pool is full.
func newFleet(t *testing.T, cfg config) *fleet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxd runs sandboxes, the hosts are network namespaces")
	}
	bins := os.Getenv("SKIFF_BIN")
	for _, b := range []string{"vk-sandbox", "sandbox-apiserver", "sandbox-envd-proxy"} {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			t.Fatalf("%s: %v (set SKIFF_BIN to the folder make build fills)", b, err)
		}
	}
	f := &fleet{t: t, cfg: cfg, hosts: map[string]*host{}, bins: bins, stop: interruptible(t)}
	logs, err := os.MkdirTemp("", "skiff-fleet-logs-")
	if err != nil {
		t.Fatal(err)
	}
	logf("fleet: interval %s, window %s; every component's log is in %s", cfg.interval, cfg.window, logs)
	t.Cleanup(func() { logf("fleet: logs kept in %s", logs) })
	start := time.Now()

	f.logs = logs
	f.env = kubetest.StartWith(t, kubetest.Options{Aggregator: true, AggregatorRouting: true, LogDir: logs})
	scheme := deploy.NewScheme()
	if err := v1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if f.admin, err = client.New(f.env.Config, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	f.dyn = dynamic.NewForConfigOrDie(f.env.Config)
	f.kc = f.env.Kubeconfig(t)
	ctx := t.Context()
	for _, ns := range []string{team, teamB, poolNS} {
		f.must(f.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	f.must(f.admin.Create(ctx, &v1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "base"},
		Spec:       v1beta1.SandboxTemplateSpec{Source: v1beta1.TemplateSource{Builtin: "base"}, CPUMilli: 500, MemoryMiB: 256},
	}))
	f.hostRBAC()

	subnet := hosttest.Subnet()
	token := fmt.Sprintf("fleet-node-token-%d", time.Now().UnixNano())
	for i, name := range []string{hostA, hostB} {
		f.hosts[name] = f.newHost(name, subnet, i, token)
	}
	// The hosts reach each other, as a fleet's do: snapshots move between
	// them, sandboxd to sandboxd.
	for _, h := range f.hosts {
		h.ns.Route(t, fmt.Sprintf("10.250.%d.0/24", subnet))
	}

	// The replicas' aggregated API listens on the hosts' gateway addresses
	// (this machine's ends of their veths): an EndpointSlice cannot name
	// loopback.
	addrs := []string{f.hosts[hostA].ns.Gateway, f.hosts[hostB].ns.Gateway}
	serving, err := deploy.InstallEndpoints(ctx, f.admin, logs, addrs, 8443)
	if err != nil {
		t.Fatal(err)
	}
	sa := fleetenv.ServiceAccountKubeconfig(t, f.env)
	f.key, f.keyB = fleetenv.APIKey(t, bins, f.kc, team), fleetenv.APIKey(t, bins, f.kc, teamB)
	for i, addr := range addrs {
		r := &replica{name: fmt.Sprintf("apiserver-%d", i+1), api: "http://" + hosttest.FreeAddr(t), admin: hosttest.FreeAddr(t)}
		args := append([]string{"serve", "--listen", strings.TrimPrefix(r.api, "http://"), "--admin-listen", r.admin,
			"--inventory", "kube", "--kubeconfig", sa, "--sandboxd-token-file", f.hosts[hostA].h.TokenFile,
			"--bind-address", addr, "--warm-pool-interval", "1s",
			"--leader-elect-lease-duration", cfg.lease.String(),
			"--leader-elect-renew-deadline", (cfg.lease * 3 / 4).String(),
			"--leader-elect-retry-period", (cfg.lease / 4).String(),
			"--log-format", "text"}, serving...)
		args = append(args, f.freshnessFlags()...)
		r.d = hosttest.NewDaemon(t, logs, r.name, filepath.Join(bins, "sandbox-apiserver"), args...)
		r.d.Start()
		f.replicas = append(f.replicas, r)
	}
	f.proxyURL, f.proxyAdm = "http://"+hosttest.FreeAddr(t), hosttest.FreeAddr(t)
	f.proxy = hosttest.NewDaemon(t, logs, "envd-proxy", filepath.Join(bins, "sandbox-envd-proxy"), append([]string{"serve",
		"--listen", strings.TrimPrefix(f.proxyURL, "http://"), "--admin-listen", f.proxyAdm, "--inventory", "kube",
		"--kubeconfig", f.kc, "--sandboxd-token-file", f.hosts[hostA].h.TokenFile, "--log-format", "text"}, f.freshnessFlags()...)...)
	f.proxy.Start()

	f.must(f.admin.Create(ctx, &v1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "base"},
		Spec:       v1beta1.SandboxWarmPoolSpec{Template: "base", Replicas: new(int32(warmReplicas))},
	}))
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := deploy.WaitAvailable(waitCtx, f.admin); err != nil {
		t.Fatal(err)
	}
	f.eventually(2*time.Minute, "both hosts listed by both replicas, the proxy ready, the pool full", func() string {
		for _, r := range f.replicas {
			if code, body := f.call(r, http.MethodGet, "/templates", nil); code != http.StatusOK || !strings.Contains(string(body), `"base"`) {
				return fmt.Sprintf("%s: templates %d %s", r.name, code, body)
			}
		}
		if code := fleetenv.HTTPCode("http://" + f.proxyAdm + "/readyz"); code != http.StatusOK {
			return fmt.Sprintf("proxy /readyz %d", code)
		}
		if n := len(f.warm()); n != warmReplicas {
			return fmt.Sprintf("%d warm sandboxes, want %d", n, warmReplicas)
		}
		// Each replica may answer as to an anonymous user for a moment
		// after it starts, before it has loaded the front-proxy CA: list
		// through the aggregator until both have (it picks one at random).
		for range 8 {
			if _, err := f.kubeList(); err != nil {
				return "kube list: " + err.Error()
			}
		}
		return ""
	})
	logf("fleet: up in %s (control plane, %d hosts, %d replicas, the proxy, a warm pool of %d)",
		time.Since(start).Round(100*time.Millisecond), len(f.hosts), len(f.replicas), warmReplicas)
	return f
}

// freshnessFlags are the readers' freshness filter flags.
func (f *fleet) freshnessFlags() []string {
	return fleetenv.FreshnessFlags(f.cfg.interval, f.cfg.window)
}

// newHost makes host name: its namespace (the index-th /30 of subnet), its
// sandboxd and its vk-sandbox, with the node's identity.
func (f *fleet) newHost(name string, subnet, index int, token string) *host {
	t := f.t
	ns := hosttest.NewNetns(t, name[len(name)-1:]+"fleet", subnet, index)
	var extra []string
	if f.cfg.sharedVolumes != "" {
		extra = []string{"--volume-dir", f.cfg.sharedVolumes, "--volume-shared", "--volume-size", "0"}
	}
	if f.cfg.fullHost == name {
		extra = append(extra, "--disk-reserve", strconv.Itoa(1<<30))
	}
	h := hosttest.NewHost(t, hosttest.Options{Name: "f" + name[len(name)-1:], NodeName: name, Token: token, Netns: ns, LogDir: f.logs, SandboxdArgs: extra})
	// vk-sandbox reaches the control plane at the same address as from
	// here, 127.0.0.1:<port>, through a relay inside the namespace.
	u, err := url.Parse(f.env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	kubeAddr := u.Host
	hs := &host{name: name, ns: ns, h: h, kube: ns.Forward(t, kubeAddr, kubeAddr)}
	node := f.env.NodeUser(t, name)
	kc := kubetest.WriteKubeconfig(t, node.Config)
	bin, args := ns.Command(filepath.Join(f.bins, "vk-sandbox"), "serve", "--kubeconfig", kc, "--node-name", name,
		"--node-ip", ns.Addr, "--sandboxd", h.Addr, "--sandboxd-token-file", h.TokenFile, "--admin-listen", "127.0.0.1:27779",
		"--kubelet-listen", ns.Addr+":10250", "--kubelet-insecure-no-auth", "--node-lease-duration", "4s",
		"--publish-interval", f.cfg.interval.String(), "--publish-min-interval", min(time.Second, f.cfg.interval).String(),
		"--log-format", "text")
	hs.vk = hosttest.NewDaemon(t, f.logs, name+"-vk-sandbox", bin, args...)
	hs.vk.Start()
	return hs
}

// hostRBAC gives the hosts' identities (group skiff:nodes) vk-sandbox's
// access as the Helm chart grants it: its ClusterRole skiff:host and its
// Role skiff:host in kube-node-lease; the NodeInventory owner policy holds
// each to its own inventory.
func (f *fleet) hostRBAC() {
	objs := charttest.Objects(f.t, charttest.Render(f.t))
	group := []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: policies.NodesGroup}}
	for _, ref := range []struct{ kind, ns string }{{"ClusterRole", ""}, {"Role", corev1.NamespaceNodeLease}} {
		role := charttest.Find(objs, ref.kind, ref.ns, "skiff:host")
		if role == nil {
			f.t.Fatalf("the chart renders no %s skiff:host", ref.kind)
		}
		f.must(f.admin.Create(f.t.Context(), role))
		meta := metav1.ObjectMeta{Name: "skiff-fleet-hosts", Namespace: ref.ns}
		roleRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: ref.kind, Name: role.GetName()}
		if ref.ns == "" {
			f.must(f.admin.Create(f.t.Context(), &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: roleRef, Subjects: group}))
		} else {
			f.must(f.admin.Create(f.t.Context(), &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: roleRef, Subjects: group}))
		}
	}
}

func (f *fleet) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// interruptible returns a channel closed on the first SIGINT or SIGTERM
// (Ctrl-C), after which the test ends and its cleanups leave nothing
// behind; a second signal kills at once.
func interruptible(t *testing.T) <-chan struct{} {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	stop, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(done) }); signal.Stop(sig) })
	go func() {
		select {
		case s := <-sig:
			logf("fleet: %v: stopping everything (again to kill at once)", s)
			signal.Stop(sig)
			interrupted.Store(true)
			close(stop)
		case <-done:
		}
	}()
	return stop
}

// eventually polls cond (which says what is still wrong, or "") every
// 100 ms until it holds, and fails the test after within.
func (f *fleet) eventually(within time.Duration, what string, cond func() string) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) || interrupted.Load() {
			f.t.Fatalf("%s: not within %s: %s", what, within, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// call makes an e2b API call on replica r as team-a.
func (f *fleet) call(r *replica, method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, r.api+path, rd)
	req.Header.Set("X-API-Key", f.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// create makes a sandbox on replica r and returns its ID, node and the
// time the create took.
func (f *fleet) create(r *replica) (id, node string, took time.Duration, err error) {
	start := time.Now()
	code, body := f.call(r, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 3600})
	took = time.Since(start)
	if code != http.StatusCreated {
		return "", "", took, fmt.Errorf("create on %s: %d %s", r.name, code, body)
	}
	var out struct{ SandboxID, ClientID string }
	if err := json.Unmarshal(body, &out); err != nil {
		return "", "", took, err
	}
	return out.SandboxID, out.ClientID, took, nil
}

// e2bList returns the IDs team-a's e2b list shows on replica r, or nil
// with the error.
func (f *fleet) e2bList(r *replica) (map[string]bool, error) {
	code, body := f.call(r, http.MethodGet, "/v2/sandboxes?limit=100", nil)
	if code != http.StatusOK {
		return nil, fmt.Errorf("list on %s: %d %s", r.name, code, body)
	}
	var list []struct{ SandboxID string }
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, sb := range list {
		ids[sb.SandboxID] = true
	}
	return ids, nil
}

// kubeList returns the sandboxes kubectl get sandboxes -A shows (through
// the aggregator, so from either replica), by name, with their nodes.
func (f *fleet) kubeList() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := f.dyn.Resource(sandboxesGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, it := range list.Items {
		node, _, _ := unstructured.NestedString(it.Object, "spec", "nodeName")
		out[it.GetName()] = node
	}
	return out, nil
}

// warm returns the IDs of the pool's warm sandboxes in the inventories
// (their shards joined).
func (f *fleet) warm() []string {
	var list v1beta1.NodeInventoryList
	if err := f.admin.List(context.Background(), &list); err != nil {
		return nil
	}
	if err := kubeinventory.Join(context.Background(), f.admin, list.Items); err != nil {
		return nil
	}
	var ids []string
	for _, inv := range list.Items {
		for _, sb := range inv.Spec.Sandboxes {
			if sb.State == v1beta1.SandboxWarm && sb.Template == "base" {
				ids = append(ids, sb.ID)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// inventory returns a host's NodeInventory with its shards joined, nil if
// there is none.
func (f *fleet) inventory(name string) *v1beta1.NodeInventory {
	inv := &v1beta1.NodeInventory{}
	if err := f.admin.Get(context.Background(), client.ObjectKey{Name: name}, inv); err != nil {
		return nil
	}
	one := []v1beta1.NodeInventory{*inv}
	if err := kubeinventory.Join(context.Background(), f.admin, one); err != nil {
		return nil
	}
	return &one[0]
}

// publishedAt returns a host's last stamp (zero if none).
func (f *fleet) publishedAt(name string) time.Time {
	if inv := f.inventory(name); inv != nil && inv.PublishedAt != nil {
		return inv.PublishedAt.Time
	}
	return time.Time{}
}

// proxyGet asks the proxy for envd's /health in sandbox id and returns the
// status code and how long it took.
func (f *fleet) proxyGet(id string) (int, time.Duration) {
	return fleetenv.ProxyHealth(f.proxyURL, id)
}

// leader returns the replica holding the warm-pool Lease, nil if none
// says it does.
func (f *fleet) leader() *replica {
	for _, r := range f.replicas {
		if r.d.Running() && hosttest.Metric(r.admin, "skiff_apiserver_warm_pool_leader") == "1" {
			return r
		}
	}
	return nil
}

// watcher records the events of a kube watch of every sandbox.
type watcher struct {
	mu     sync.Mutex
	events []watch.Event
	stop   func()
}

func (f *fleet) watch() *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{}
	var wg sync.WaitGroup
	w.stop = func() { cancel(); wg.Wait() }
	f.t.Cleanup(w.stop)
	wi, err := f.dyn.Resource(sandboxesGVR).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatalf("watch sandboxes: %v", err)
	}
	wg.Go(func() {
		defer wi.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-wi.ResultChan():
				if !ok {
					return
				}
				w.mu.Lock()
				w.events = append(w.events, ev)
				w.mu.Unlock()
			}
		}
	})
	return w
}

// since returns the events recorded from index i on.
func (w *watcher) since(i int) []watch.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events[min(i, len(w.events)):])
}

func (w *watcher) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}

// synCounter counts the TCP SYNs that reach a host's sandboxd port inside
// its namespace (an nft table of the test's own there).
type synCounter struct {
	ns    *hosttest.Netns
	table string
}

func newSynCounter(t *testing.T, ns *hosttest.Netns, port int) *synCounter {
	t.Helper()
	c := &synCounter{ns: ns, table: "skiff_fleet_syn"}
	script := fmt.Sprintf("table inet %s {\n chain input {\n  type filter hook input priority -300; policy accept;\n  tcp dport %d tcp flags & (syn|ack) == syn counter\n }\n}\n", c.table, port)
	cmd := exec.Command("nsenter", "--net="+ns.Path, "--", "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s", ns.Name, err, out)
	}
	return c
}

// count reads the counter.
func (c *synCounter) count(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+c.ns.Path, "--", "nft", "list", "table", "inet", c.table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	_, rest, ok := strings.Cut(string(out), "counter packets ")
	if !ok {
		t.Fatalf("no counter in %s", out)
	}
	n, err := strconv.Atoi(strings.Fields(rest)[0])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// grepLogs returns the lines of a log file, from byte offset on, that
// contain s.
func grepLogs(path string, offset int64, s string) []string {
	data, err := os.ReadFile(path)
	if err != nil || int64(len(data)) < offset {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(data[offset:]), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// lineOK prints a lane's PASS or FAIL line with its figure.
func lineOK(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	status := "PASS"
	if !ok {
		status = "FAIL"
		t.Errorf(format, args...)
	}
	logf("%s %s: %s", status, t.Name(), fmt.Sprintf(format, args...))
}

// interrupted is set by the first SIGINT or SIGTERM.
var interrupted atomic.Bool
