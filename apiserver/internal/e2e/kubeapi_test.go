package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

var sandboxesGVR = sbv1.GroupVersion.WithResource("sandboxes")

// installAggregated installs the aggregated API's objects for a replica on
// this machine (deploy.InstallLocal) and returns the serve flags of one
// that runs as their ServiceAccount, so that the RBAC deploy grants is all
// it has.
func installAggregated(t *testing.T, env *kubetest.Env, dir string) []string {
	t.Helper()
	ctx := t.Context()
	c := deployClient(t, env)
	_, portStr, _ := strings.Cut(hosttest.FreeAddr(t), ":")
	port, _ := strconv.Atoi(portStr)
	serving, err := deploy.InstallLocal(ctx, c, dir, port)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tok, err := cs.CoreV1().ServiceAccounts(deploy.DefaultNamespace).CreateToken(ctx, deploy.DefaultName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa := kubetest.WriteKubeconfig(t, &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: tok.Status.Token})
	return append([]string{"--kubeconfig", sa}, serving...)
}

// waitAvailable waits until the aggregator reports the APIService
// Available (it has reached the replica and checked its certificate).
func waitAvailable(t *testing.T, env *kubetest.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := deploy.WaitAvailable(ctx, deployClient(t, env)); err != nil {
		t.Fatal(err)
	}
}

// deployClient reaches env as its admin with deploy's scheme (env's own
// scheme is shared by the test's goroutines and stays as it is).
func deployClient(t testing.TB, env *kubetest.Env) client.Client {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: deploy.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kubectl runs kubectl (built at the control plane's version) with
// kubeconfig kc.
func kubectl(t *testing.T, kc string, args ...string) (string, error) {
	t.Helper()
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
	return string(out), err
}

// kubectlNames lists sandbox names with kubectl get -o name-like JSON.
func kubectlNames(t *testing.T, kc string, args ...string) []string {
	t.Helper()
	out, err := kubectl(t, kc, append([]string{"get", "sandboxes", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("kubectl get sandboxes %v: %v: %s", args, err, out)
	}
	var l struct {
		Items []sbv1.Sandbox `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("kubectl output: %v: %s", err, out)
	}
	names := make([]string, 0, len(l.Items))
	for _, sb := range l.Items {
		names = append(names, sb.Namespace+"/"+sb.Name)
	}
	slices.Sort(names)
	return names
}

// e2bNames lists a team's sandboxes through the e2b API.
func (s *system) e2bNames(key, team string) []string {
	s.t.Helper()
	code, body := s.call(key, http.MethodGet, "/v2/sandboxes", nil)
	if code != http.StatusOK {
		s.t.Fatalf("e2b list: %d %s", code, body)
	}
	var l []struct{ SandboxID string }
	if err := json.Unmarshal(body, &l); err != nil {
		s.t.Fatal(err)
	}
	out := make([]string, 0, len(l))
	for _, sb := range l {
		out = append(out, team+"/"+sb.SandboxID)
	}
	slices.Sort(out)
	return out
}

// create creates a sandbox through the e2b API and returns its ID.
func (s *system) create(key string, body map[string]any) string {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, out := s.call(key, http.MethodPost, "/v2/sandboxes", body)
		if code == http.StatusCreated {
			var c struct{ SandboxID string }
			if err := json.Unmarshal(out, &c); err != nil {
				s.t.Fatal(err)
			}
			return c.SandboxID
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			s.t.Fatalf("create: %d %s", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// eventually polls f until it returns "" or the deadline passes, then fails
// with f's last answer.
func eventually(t *testing.T, within time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestAggregatedAPI(t *testing.T) {
	began := time.Now()
	defer func() { t.Logf("took %s", time.Since(began)) }()
	var k kubeSystem
	const stale = 6 * time.Second
	s := newKubeSystemWith(t, kubeSystemOptions{aggregated: true, staleAfter: stale, kube: &k})
	env := k.env
	waitAvailable(t, env)
	admin := env.Kubeconfig(t)

	// Three sandboxes: two of team-a (one labelled by its metadata), one of
	// team-b.
	a1 := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 300, "metadata": map[string]string{"app": "web", "has space": "x"}})
	a2 := s.create(s.keyA, map[string]any{"templateID": "base", "timeout": 300})
	b1 := s.create(s.keyB, map[string]any{"templateID": "base", "timeout": 300})
	want := []string{"team-a/" + a1, "team-a/" + a2, "team-b/" + b1}
	slices.Sort(want)

	// kubectl get -A lists what the e2b API lists, once the inventory has
	// them.
	eventually(t, 30*time.Second, func() string {
		if got := kubectlNames(t, admin, "-A"); !slices.Equal(got, want) {
			return "kubectl get sandboxes -A: " + strings.Join(got, ",") + "; want " + strings.Join(want, ",")
		}
		return ""
	})
	e2b := append(s.e2bNames(s.keyA, "team-a"), s.e2bNames(s.keyB, "team-b")...)
	slices.Sort(e2b)
	if !slices.Equal(e2b, want) {
		t.Errorf("e2b lists %v, kubectl %v", e2b, want)
	}
	if got := kubectlNames(t, admin, "-n", "team-b"); !slices.Equal(got, []string{"team-b/" + b1}) {
		t.Errorf("-n team-b: %v", got)
	}
	if got := kubectlNames(t, admin, "-A", "-l", "app=web"); !slices.Equal(got, []string{"team-a/" + a1}) {
		t.Errorf("-l app=web: %v", got)
	}
	if got := kubectlNames(t, admin, "-A", "--field-selector", "spec.nodeName=host-k,status.state=running"); !slices.Equal(got, want) {
		t.Errorf("field selector: %v", got)
	}
	if got := kubectlNames(t, admin, "-A", "--field-selector", "spec.template=other"); len(got) != 0 {
		t.Errorf("field selector spec.template=other: %v", got)
	}
	if out, err := kubectl(t, admin, "get", "sandboxes", "-A", "--field-selector", "spec.cpu=1"); err == nil || !strings.Contains(out, "not supported") {
		t.Errorf("an unknown field selector: %v %s", err, out)
	}
	// Paging: kubectl's chunking, one item a page.
	if out, err := kubectl(t, admin, "get", "sandboxes", "-A", "--chunk-size", "1", "-o", "name"); err != nil || strings.Count(out, "sandbox.sandbox.skiff.dev/") != 3 {
		t.Errorf("--chunk-size 1: %v %s", err, out)
	}
	// The table: its columns, and -o wide's.
	out, err := kubectl(t, admin, "get", "sandboxes", "-n", "team-a")
	if err != nil || !strings.HasPrefix(out, "NAME") || !containsAll(out, "TEMPLATE", "STATE", "NODE", "AGE", "ENDS", a1, "base", "running", "host-k") {
		t.Errorf("kubectl get: %v\n%s", err, out)
	}
	if out, err := kubectl(t, admin, "get", "sbx", "-n", "team-a", "-o", "wide"); err != nil || !containsAll(out, "POOL", "CPU", "MEMORY", "256") {
		t.Errorf("kubectl get -o wide: %v\n%s", err, out)
	}
	// The aggregator fetches the replica's OpenAPI on its own schedule after
	// the APIService turns Available: explain may not find the resource at
	// first.
	explain := func() (string, error) { return kubectl(t, admin, "explain", "sandboxes.spec.nodeName") }
	out, err = explain()
	for deadline := time.Now().Add(time.Minute); err != nil && strings.Contains(out, "couldn't find resource") && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		out, err = explain()
	}
	if err != nil || !strings.Contains(out, "the host (the name of its NodeInventory)") {
		t.Errorf("kubectl explain: %v\n%s", err, out)
	}

	// RBAC: a user with no role is refused; one bound to the viewer role in
	// team-a sees team-a only.
	eve := kubetest.WriteKubeconfig(t, env.AddUser(t, "eve").Config)
	if out, err := kubectl(t, eve, "get", "sandboxes", "-n", "team-a"); err == nil || !strings.Contains(out, "Forbidden") {
		t.Errorf("eve lists team-a: %v %s", err, out)
	}
	ann := env.AddUser(t, "ann")
	if err := env.Client.Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ann-views", Namespace: "team-a"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: deploy.ViewerRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "ann"}},
	}); err != nil {
		t.Fatal(err)
	}
	annKC := kubetest.WriteKubeconfig(t, ann.Config)
	eventually(t, 10*time.Second, func() string {
		if got := kubectlNames(t, annKC, "-n", "team-a"); len(got) != 2 {
			return "ann in team-a: " + strings.Join(got, ",")
		}
		return ""
	})
	if out, err := kubectl(t, annKC, "get", "sandboxes", "-n", "team-b"); err == nil || !strings.Contains(out, "Forbidden") {
		t.Errorf("ann lists team-b: %v %s", err, out)
	}
	if out, err := kubectl(t, annKC, "delete", "sandbox", a2, "-n", "team-a"); err == nil || !strings.Contains(out, "Forbidden") {
		t.Errorf("ann (a viewer) deletes: %v %s", err, out)
	}

	dyn := dynamic.NewForConfigOrDie(env.Config)
	watchesWithASelector(t, s, admin, dyn, a1, want)

	// A client-go informer and a raw watch see the same sandboxes.
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	inf := factory.ForResource(sandboxesGVR).Informer()
	deleted := make(chan string, 16)
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			deleted <- u.GetName()
		} else if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			deleted <- d.Key
		}
	}}); err != nil {
		t.Fatal(err)
	}
	stopInf := make(chan struct{})
	defer close(stopInf)
	factory.Start(stopInf)
	if !toolscache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("the informer never synced")
	}
	var informed []string
	for _, obj := range inf.GetStore().List() {
		u := obj.(*unstructured.Unstructured)
		informed = append(informed, u.GetNamespace()+"/"+u.GetName())
	}
	slices.Sort(informed)
	if !slices.Equal(informed, want) {
		t.Errorf("informer lists %v, want %v", informed, want)
	}
	w, err := dyn.Resource(sandboxesGVR).Namespace("").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	burst := map[string]bool{}
	for range want {
		e := next(t, w)
		if e.Type != watch.Added {
			t.Fatalf("opening burst: %s", e.Type)
		}
		u := e.Object.(*unstructured.Unstructured)
		burst[u.GetNamespace()+"/"+u.GetName()] = true
	}
	if len(burst) != len(want) {
		t.Errorf("opening burst %v", burst)
	}

	// kubectl get -w: the opening burst, then the delete below.
	kw := startKubectlWatch(t, admin, "get", "sandboxes", "-A", "-w", "--output-watch-events")
	eventually(t, 30*time.Second, func() string {
		if out := kw.String(); strings.Count(out, "ADDED") != 3 || !containsAll(out, a1, a2, b1) {
			return "kubectl get -w so far:\n" + out
		}
		return ""
	})

	// kubectl delete kills the sandbox on its host: the e2b API no longer
	// has it, the watch and the informer say DELETED.
	if out, err := kubectl(t, admin, "delete", "sandbox", a2, "-n", "team-a"); err != nil {
		t.Fatalf("kubectl delete: %v %s", err, out)
	}
	if code, _ := s.call(s.keyA, http.MethodGet, "/sandboxes/"+a2, nil); code != http.StatusNotFound {
		t.Errorf("e2b get after kubectl delete: %d", code)
	}
	if e := next(t, w); e.Type != watch.Deleted || e.Object.(*unstructured.Unstructured).GetName() != a2 {
		t.Errorf("after delete: %s", e.Type)
	}
	eventually(t, 30*time.Second, func() string {
		for _, line := range strings.Split(kw.String(), "\n") {
			if strings.HasPrefix(line, "DELETED") && strings.Contains(line, a2) {
				return ""
			}
		}
		return "kubectl get -w shows no DELETED for " + a2 + ":\n" + kw.String()
	})
	select {
	case name := <-deleted:
		if !strings.HasSuffix(name, a2) {
			t.Errorf("informer deleted %s", name)
		}
	case <-time.After(30 * time.Second):
		t.Error("the informer saw no delete")
	}
	if out, err := kubectl(t, admin, "delete", "sandbox", a2, "-n", "team-a"); err == nil || !strings.Contains(out, "NotFound") {
		t.Errorf("delete again: %v %s", err, out)
	}
	if out, err := kubectl(t, admin, "delete", "sandbox", b1, "-n", "team-a"); err == nil || !strings.Contains(out, "NotFound") {
		t.Errorf("delete of team-b's sandbox in team-a: %v %s", err, out)
	}

	// The host stops publishing while another keeps on: after the window,
	// DELETED for each of its sandboxes; when it publishes again, ADDED.
	stopOther := publishEmpty(t, env.Client, "host-z", time.Second)
	defer stopOther()
	k.stopPublishing()
	gone := map[string]bool{}
	for len(gone) < 2 {
		e := next(t, w)
		if e.Type != watch.Deleted {
			t.Fatalf("after the host stopped publishing: %s", e.Type)
		}
		gone[e.Object.(*unstructured.Unstructured).GetName()] = true
	}
	if !gone[a1] || !gone[b1] {
		t.Errorf("deleted on staleness: %v", gone)
	}
	if out, err := kubectl(t, admin, "delete", "sandbox", a1, "-n", "team-a"); err == nil || !strings.Contains(out, "NotFound") {
		t.Errorf("delete on a stale node: %v %s", err, out)
	}
	k.stopPublishing = publishHost(t, env.Client, s.sandboxd, s.token, 2*time.Second)
	back := map[string]bool{}
	for len(back) < 2 {
		e := next(t, w)
		if e.Type != watch.Added {
			t.Fatalf("after the host came back: %s", e.Type)
		}
		back[e.Object.(*unstructured.Unstructured).GetName()] = true
	}
	if !back[a1] || !back[b1] {
		t.Errorf("added on return: %v", back)
	}
}

// watchesWithASelector checks that watches with a field selector (a raw
// watch, kubectl get -w and an informer) see a sandbox that leaves the
// selection as DELETED and one that enters it as ADDED, as the
// kube-apiserver's watch cache sends them: a1 (running, as the others in
// want) is paused, then resumed.
func watchesWithASelector(t *testing.T, s *system, admin string, dyn dynamic.Interface, a1 string, want []string) {
	t.Helper()
	const running = "status.state=running"
	w, err := dyn.Resource(sandboxesGVR).Namespace("").Watch(t.Context(), metav1.ListOptions{FieldSelector: running})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var lastRV string
	for range want {
		e := next(t, w)
		if e.Type != watch.Added {
			t.Fatalf("opening burst of a watch of %s: %s", running, e.Type)
		}
		if u := e.Object.(*unstructured.Unstructured); u.GetName() == a1 {
			lastRV = u.GetResourceVersion()
		}
	}
	kw := startKubectlWatch(t, admin, "get", "sandboxes", "-A", "-w", "--output-watch-events", "--field-selector", running)
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, "", func(o *metav1.ListOptions) { o.FieldSelector = running })
	inf := factory.ForResource(sandboxesGVR).Informer()
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !toolscache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("the informer of " + running + " never synced")
	}
	eventually(t, 30*time.Second, func() string {
		if out := kw.String(); strings.Count(out, "ADDED") != len(want) {
			return "kubectl get -w --field-selector " + running + " so far:\n" + out
		}
		return ""
	})
	// nextOfA1 returns the watch's next event about a1.
	nextOfA1 := func() (watch.EventType, *unstructured.Unstructured) {
		t.Helper()
		for {
			e := next(t, w)
			if u, ok := e.Object.(*unstructured.Unstructured); ok && u.GetName() == a1 {
				return e.Type, u
			}
		}
	}
	informed := func() bool {
		_, ok, _ := inf.GetStore().GetByKey("team-a/" + a1)
		return ok
	}
	kubectlSaw := func(typ string) int {
		n := 0
		for _, line := range strings.Split(kw.String(), "\n") {
			if strings.HasPrefix(line, typ) && strings.Contains(line, a1) {
				n++
			}
		}
		return n
	}

	// Paused, a1 leaves the selection: DELETED, as it was last selected
	// (running) at the pause's resourceVersion; kubectl says so and the
	// informer drops it.
	if code, body := s.call(s.keyA, http.MethodPost, "/sandboxes/"+a1+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, body)
	}
	typ, u := nextOfA1()
	state, _, _ := unstructured.NestedString(u.Object, "status", "state")
	if typ != watch.Deleted || state != "running" || u.GetResourceVersion() == lastRV {
		t.Errorf("after the pause, a watch of %s: %s of a %s sandbox at resourceVersion %s (it was at %s), want DELETED of the running one at the pause's",
			running, typ, state, u.GetResourceVersion(), lastRV)
	}
	eventually(t, 30*time.Second, func() string {
		if kubectlSaw("DELETED") != 1 {
			return "kubectl get -w --field-selector " + running + " shows no DELETED for the paused " + a1 + ":\n" + kw.String()
		}
		if informed() {
			return "the informer of " + running + " still has the paused " + a1
		}
		return ""
	})

	// Resumed, it enters again: ADDED.
	if code, body := s.call(s.keyA, http.MethodPost, "/sandboxes/"+a1+"/connect", map[string]any{"timeout": 300}); code != http.StatusCreated {
		t.Fatalf("connect to the paused sandbox: %d %s", code, body)
	}
	typ, u = nextOfA1()
	state, _, _ = unstructured.NestedString(u.Object, "status", "state")
	if typ != watch.Added || state != "running" {
		t.Errorf("after the resume, a watch of %s: %s of a %s sandbox, want ADDED of a running one", running, typ, state)
	}
	eventually(t, 30*time.Second, func() string {
		if kubectlSaw("ADDED") != 2 {
			return "kubectl get -w --field-selector " + running + " shows no second ADDED for the resumed " + a1 + ":\n" + kw.String()
		}
		if !informed() {
			return "the informer of " + running + " does not have the resumed " + a1
		}
		return ""
	})
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startKubectlWatch runs kubectl (a watch, which does not end by itself)
// until the test ends, its output in the returned buffer.
func startKubectlWatch(t *testing.T, kc string, args ...string) *lockedBuffer {
	t.Helper()
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedBuffer{}
	cmd := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", kc}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	return out
}

// next returns the watch's next event that is not a bookmark.
func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch closed")
			}
			if e.Type == watch.Bookmark {
				continue
			}
			return e
		case <-timeout:
			t.Fatal("no watch event in 60s")
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// publishEmpty publishes the NodeInventory of a host with no sandboxes,
// stamped every interval, until stop: a live node that keeps the fleet's
// freshness reference moving, so that another node's silence makes it
// stale.
func publishEmpty(t *testing.T, c client.Client, node string, interval time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			inv := &v1beta1.NodeInventory{
				TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
				ObjectMeta:  metav1.ObjectMeta{Name: node},
				PublishedAt: &metav1.Time{Time: time.Now()},
				Spec:        v1beta1.NodeInventorySpec{Endpoint: "127.0.0.1:1", Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 1}},
			}
			//nolint:staticcheck // as publishHost
			if err := c.Patch(ctx, inv, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership); err != nil && ctx.Err() == nil {
				t.Logf("publish %s: %v", node, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}
