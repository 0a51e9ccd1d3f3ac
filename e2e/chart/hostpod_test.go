package chart

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// TestHostPod: vk-sandbox run as the chart's DaemonSet runs it (its
// arguments from the render, its identity a token of the skiff-host
// service account bound to a pod on node n1, so the chart's RBAC and policy
// only), beside a real sandboxd, registers the virtual node skiff-n1, keeps
// its Lease and publishes its NodeInventory, refused nothing.
func TestHostPod(t *testing.T) {
	h := hosttest.NewHost(t, hosttest.Options{Name: "chart", NodeName: "skiff-n1"})
	env := startControlPlane(t, kubetest.Options{})
	ctx := t.Context()
	objs := objects(t, render(t, "default"))
	install(t, env.Client, objs)

	kc := kubetest.WriteKubeconfig(t, podToken(t, env, "skiff-host", "n1"))
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, env.Config.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	admin, kubelet := hosttest.FreeAddr(t), hosttest.FreeAddr(t)
	// What the kubelet would pass: the pod's environment expanded, and
	// the paths and ports of this machine instead of the pod's.
	expand := strings.NewReplacer("$(SKIFF_NODE_NAME)", "skiff-n1", "$(HOST_IP)", "127.0.0.1")
	var args []string
	for _, a := range containerArgsOf(t, objs, "DaemonSet", "skiff-host", "vk-sandbox") {
		a = expand.Replace(a)
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--sandboxd", "--sandboxd-endpoint":
			a = name + "=" + h.Addr
		case "--sandboxd-token-file":
			a = name + "=" + h.TokenFile
		case "--admin-listen":
			a = name + "=" + admin
		case "--kubelet-listen":
			a = name + "=" + kubelet
		case "--kubelet-client-ca-file":
			a = name + "=" + ca
		}
		args = append(args, a)
	}
	args = append(args, "--kubeconfig", kc, "--log-format", "text")
	if strings.Contains(strings.Join(args, " "), "$(") {
		t.Fatalf("unexpanded variables in %v", args)
	}
	vk := hosttest.NewDaemon(t, t.TempDir(), "vk-sandbox", binary(t, "vk-sandbox"), args...)
	vk.Start()

	deadline := time.Now().Add(time.Minute)
	for {
		var inv v1beta1.NodeInventory
		var node corev1.Node
		var lease coordinationv1.Lease
		invErr := env.Client.Get(ctx, client.ObjectKey{Name: "skiff-n1"}, &inv)
		nodeErr := env.Client.Get(ctx, client.ObjectKey{Name: "skiff-n1"}, &node)
		leaseErr := env.Client.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: "skiff-n1"}, &lease)
		ready := ready(admin)
		if invErr == nil && inv.PublishedAt != nil && nodeErr == nil && nodeReady(&node) && leaseErr == nil && ready {
			t.Logf("published: NodeInventory skiff-n1 at %s (endpoint %s), node skiff-n1 Ready, its lease, /readyz 200",
				inv.PublishedAt.Format(time.RFC3339), inv.Spec.Endpoint)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within a minute: inventory %v, node %v (ready %v), lease %v, /readyz %v", invErr, nodeErr, nodeReady(&node), leaseErr, ready)
		}
		time.Sleep(250 * time.Millisecond)
	}
	checkAlertMetrics(t, admin, "skiff_vk_sandbox_")
	log, err := os.ReadFile(vk.Log)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"forbidden", "Forbidden"} {
		if strings.Contains(string(log), bad) {
			t.Errorf("vk-sandbox was refused something:\n%s", log)
			break
		}
	}
}

// alertMetric is a Skiff metric an alert's expression names.
var alertMetric = regexp.MustCompile(`\bskiff_[a-z_]+`)

// checkAlertMetrics: every metric with prefix that the PrometheusRule's
// alerts name is one the daemon whose admin endpoint is admin exports, and
// every Skiff metric they name has the prefix of a daemon these tests run.
func checkAlertMetrics(t *testing.T, admin, prefix string) {
	t.Helper()
	rule := find(objects(t, render(t, "default", "--set", "monitoring.prometheusRule=true")), "PrometheusRule", namespace, "skiff")
	if rule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	var names []string
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			expr, _, _ := unstructured.NestedString(r.(map[string]any), "expr")
			names = append(names, alertMetric.FindAllString(expr, -1)...)
		}
	}
	page, err := hosttest.MetricsPage(admin)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(page)
	checked := 0
	for _, name := range names {
		if !strings.HasPrefix(name, "skiff_apiserver_") && !strings.HasPrefix(name, "skiff_vk_sandbox_") {
			t.Errorf("an alert names %s, which no test here checks", name)
		}
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		checked++
		if !regexp.MustCompile(`(?m)^` + name + `[{ ]`).Match(body) {
			t.Errorf("an alert names %s, which %s/metrics does not export", name, admin)
		}
	}
	if checked == 0 {
		t.Errorf("no alert names a metric of %s", prefix)
	}
}

// nodeReady: the node's status (patched by vk-sandbox) says Ready.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ready(admin string) bool {
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// containerArgsOf are the arguments of the named container of the rendered
// workload.
func containerArgsOf(t *testing.T, objs []*unstructured.Unstructured, kind, name, container string) []string {
	t.Helper()
	obj := find(objs, kind, namespace, name)
	if obj == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		m := c.(map[string]any)
		if m["name"] == container {
			args, _, _ := unstructured.NestedStringSlice(m, "args")
			return args
		}
	}
	t.Fatalf("%s %s has no container %s", kind, name, container)
	return nil
}
