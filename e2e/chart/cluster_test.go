package chart

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// plain is an object as JSON decodes it, so that typed and rendered
// objects compare alike (numbers as float64, no empty fields).
func plain(t testing.TB, v any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMatchesDeploy: the chart's apiserver part renders the objects
// apiserver/deploy builds (which the control-plane tests install): the same
// names, rules, bindings, Service and APIService, and at least its labels.
func TestMatchesDeploy(t *testing.T) {
	rendered := objects(t, render(t, "default"))
	for _, obj := range deploy.Objects(deploy.Config{Namespace: namespace}) {
		want := plain(t, obj)
		kind := want["kind"].(string)
		got := find(rendered, kind, obj.GetNamespace(), obj.GetName())
		if got == nil {
			t.Errorf("the chart renders no %s %s/%s (apiserver/deploy has it)", kind, obj.GetNamespace(), obj.GetName())
			continue
		}
		have := plain(t, got.Object)
		for _, field := range []string{"rules", "roleRef", "subjects", "spec"} {
			w, g := want[field], have[field]
			if field == "spec" && kind == "APIService" {
				delete(w.(map[string]any), "caBundle")
				delete(g.(map[string]any), "caBundle")
			}
			if !reflect.DeepEqual(w, g) {
				t.Errorf("%s %s: %s is %v in the chart, %v in apiserver/deploy", kind, obj.GetName(), field, g, w)
			}
		}
		labels := got.GetLabels()
		for k, v := range obj.GetLabels() {
			if labels[k] != v {
				t.Errorf("%s %s: label %s=%q in the chart, %q in apiserver/deploy", kind, obj.GetName(), k, labels[k], v)
			}
		}
	}
}

// TestServingCert: the self-signed serving certificate the chart makes is
// signed by the APIService's caBundle, for the Service's DNS names.
func TestServingCert(t *testing.T) {
	rendered := objects(t, render(t, "default"))
	secret := find(rendered, "Secret", namespace, "sandbox-apiserver-serving")
	svc := find(rendered, "APIService", "", deploy.APIServiceName)
	if secret == nil || svc == nil {
		t.Fatal("no serving Secret or APIService rendered")
	}
	data := func(key string) []byte {
		s, _, _ := unstructured.NestedString(secret.Object, "data", key)
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) == 0 {
			t.Fatalf("Secret key %s: %v", key, err)
		}
		return b
	}
	bundle, _, _ := unstructured.NestedString(svc.Object, "spec", "caBundle")
	if ca, err := base64.StdEncoding.DecodeString(bundle); err != nil || string(ca) != string(data("ca.crt")) {
		t.Fatalf("the APIService's caBundle is not the Secret's ca.crt (%v)", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data("ca.crt")) {
		t.Fatal("ca.crt holds no certificate")
	}
	block, _ := pem.Decode(data("tls.crt"))
	if block == nil {
		t.Fatal("tls.crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range deploy.ServiceDNSNames(deploy.Config{Namespace: namespace}) {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the serving certificate for %s: %v", name, err)
		}
	}
}

// startControlPlane is a kube-apiserver with the aggregator, and the
// release namespace.
func startControlPlane(t *testing.T, o kubetest.Options) *kubetest.Env {
	t.Helper()
	env := kubetest.StartWith(t, o)
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	return env
}

// external are the kinds of other projects' CRDs (Prometheus Operator,
// cert-manager), which the test control plane does not have.
var external = []string{"Certificate", "Issuer", "PrometheusRule", "ServiceMonitor"}

// TestServerSideDryRun: every object of every value set, CRDs first, is
// accepted by a real kube-apiserver in a server-side apply dry run with
// strict field validation, except those of other projects' CRDs, which
// are named.
func TestServerSideDryRun(t *testing.T) {
	env := startControlPlane(t, kubetest.Options{NoPolicies: true})
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range valueSets {
		objs := objects(t, render(t, set))
		// CRDs first, as helm installs them.
		slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
			return boolRank(b.GetKind() == "CustomResourceDefinition") - boolRank(a.GetKind() == "CustomResourceDefinition")
		})
		var skipped []string
		for _, obj := range objs {
			err := c.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(obj), client.DryRunAll,
				client.FieldOwner("helm"), client.ForceOwnership)
			if meta.IsNoMatchError(err) && slices.Contains(external, obj.GetKind()) {
				skipped = append(skipped, obj.GetKind())
				continue
			}
			if err != nil {
				t.Errorf("%s: %s %s/%s refused: %v", set, obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
			}
		}
		slices.Sort(skipped)
		t.Logf("%s: %d objects accepted; not checked, their CRDs are other projects': %v", set, len(objs)-len(skipped), skipped)
		if set == "full" && !slices.Equal(skipped, external) {
			t.Errorf("full: skipped %v, want exactly %v", skipped, external)
		}
	}
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// install creates objs (CRDs excepted: the control plane has them) for
// real.
func install(t *testing.T, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		if obj.GetKind() == "CustomResourceDefinition" {
			continue
		}
		if err := c.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}
}

// podToken is a service account token bound to a pod on node: what a host
// pod's vk-sandbox authenticates with, naming its node.
func podToken(t *testing.T, env *kubetest.Env, sa, node string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "host-" + node, Namespace: namespace},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node,
			Containers: []corev1.Container{{Name: "vk-sandbox", Image: "skiff"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: tok.Status.Token}
}

// TestHostPolicy: a host pod's token, which names its node, may write the
// virtual node, NodeInventory (and its shards) and Lease of that node and
// the pods bound to it, and nothing of another host's; the chart's RBAC and policy, on a
// real kube-apiserver.
func TestHostPolicy(t *testing.T) {
	env := startControlPlane(t, kubetest.Options{NoPolicies: true})
	ctx := t.Context()
	objs := objects(t, render(t, "default"))
	install(t, env.Client, objs)
	host, err := client.New(podToken(t, env, "skiff-host", "n1"), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	inventory := func(name string) *v1beta1.NodeInventory {
		return &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.NodeInventorySpec{
			Endpoint: "10.0.0.1:27777", Capacity: v1beta1.NodeCapacity{CPUMilli: 1, MemoryMiB: 1, Sandboxes: 1}}}
	}
	// The policy loads a moment after its binding is created.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := host.Create(ctx, inventory("skiff-n2"), client.DryRunAll)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "nodeinventory-host.skiff.dev") {
			if !strings.Contains(err.Error(), "the skiff host skiff-n1 may not create nodeinventories skiff-n2") {
				t.Errorf("the refusal does not say why: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("another host's NodeInventory not refused within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := host.Create(ctx, inventory("skiff-n1")); err != nil {
		t.Errorf("the host's own NodeInventory: %v", err)
	}
	// Its inventory's shards, and no other host's (nor one named for
	// another host while naming this one).
	for _, c := range []struct {
		name, node string
		ok         bool
	}{{"skiff-n1-s0", "skiff-n1", true}, {"skiff-n1-s15", "skiff-n1", true}, {"skiff-n2-s0", "skiff-n2", false}, {"skiff-n2-s0", "skiff-n1", false}} {
		var index int32
		_, _ = fmt.Sscanf(c.name[strings.LastIndex(c.name, "-s")+2:], "%d", &index)
		err := host.Create(ctx, &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: c.name},
			Spec: v1beta1.NodeInventoryShardSpec{Node: c.node, Index: index}})
		if ok := err == nil; ok != c.ok {
			t.Errorf("create shard %s of %s: %v (want allowed: %v)", c.name, c.node, err, c.ok)
		}
	}
	for name, wantOK := range map[string]bool{"skiff-n1": true, "skiff-n2": false, "n1": false} {
		err := host.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if ok := err == nil; ok != wantOK {
			t.Errorf("create node %s: %v (want allowed: %v)", name, err, wantOK)
		}
	}
	for name, wantOK := range map[string]bool{"skiff-n1": true, "skiff-n2": false} {
		err := host.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease}})
		if ok := err == nil; ok != wantOK {
			t.Errorf("create lease %s: %v (want allowed: %v)", name, err, wantOK)
		}
	}
	// Pods: the host deletes those bound to its virtual node only.
	for node, wantOK := range map[string]bool{"skiff-n1": true, "skiff-n2": false} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-" + node, Namespace: namespace},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "sandbox", Image: "base"}}}}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		err := host.Delete(ctx, pod)
		if ok := err == nil; ok != wantOK {
			t.Errorf("delete a pod on %s: %v (want allowed: %v)", node, err, wantOK)
		}
	}
	// A token that names no node (not a pod's) is refused everything.
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "skiff-host", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	loose, err := client.New(&rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData},
		BearerToken: tok.Status.Token}, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := loose.Create(ctx, inventory("skiff-n3"), client.DryRunAll); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "(no node in its token)") {
		t.Errorf("a token without a node: %v", err)
	}
}

// TestAPIServiceAvailable: the apiserver part's objects, as the chart
// renders them, installed into a real control plane; a sandbox-apiserver
// replica run with the chart's serving certificate and its service
// account's token (so with the chart's RBAC only); the APIService turns
// Available and kubectl's list of sandboxes answers.
func TestAPIServiceAvailable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the replica listens in a network namespace's address, which an EndpointSlice can name")
	}
	bin := binary(t, "sandbox-apiserver")
	env := startControlPlane(t, kubetest.Options{Aggregator: true, AggregatorRouting: true})
	ctx := t.Context()
	objs := objects(t, render(t, "default"))
	var part []*unstructured.Unstructured
	for _, o := range objs {
		name := o.GetLabels()["app.kubernetes.io/name"]
		if name == "sandbox-apiserver" || o.GetName() == "skiff-node-token" || strings.HasPrefix(o.GetName(), "skiff:sandboxes:") {
			part = append(part, o)
		}
	}
	install(t, env.Client, part)

	// No kubelet runs pods here: the replica runs on this machine, at the
	// address of a network namespace's veth, which the Service's
	// EndpointSlice names as the EndpointSlice controller would a pod's.
	ns := hosttest.NewNetns(t, "chart", hosttest.Subnet(), 0)
	slice := deploy.EndpointSlice(deploy.Config{Namespace: namespace, Endpoints: []string{ns.Gateway}})
	if err := env.Client.Create(ctx, slice); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	secret := find(part, "Secret", namespace, "sandbox-apiserver-serving")
	token := find(part, "Secret", namespace, "skiff-node-token")
	files := map[string]string{}
	for file, src := range map[string]struct {
		obj *unstructured.Unstructured
		key string
	}{"tls.crt": {secret, "tls.crt"}, "tls.key": {secret, "tls.key"}, "token": {token, "token"}} {
		s, _, _ := unstructured.NestedString(src.obj.Object, "data", src.key)
		data, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		files[file] = filepath.Join(dir, file)
		if err := os.WriteFile(files[file], data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "sandbox-apiserver", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := kubetest.WriteKubeconfig(t, &rest.Config{Host: env.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: tok.Status.Token})
	// The Deployment's arguments, less what a pod has and this machine not.
	args := containerArgs(t, objs, "Deployment", "sandbox-apiserver")
	args = slices.DeleteFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--listen=") || strings.HasPrefix(a, "--admin-listen=") ||
			strings.HasPrefix(a, "--tls-") || strings.HasPrefix(a, "--sandboxd-token-file=")
	})
	adminAddr := hosttest.FreeAddr(t)
	args = append(args, "--listen", hosttest.FreeAddr(t), "--admin-listen", adminAddr,
		"--kubeconfig", kc, "--bind-address", ns.Gateway, "--leader-elect-namespace", namespace,
		"--tls-cert-file", files["tls.crt"], "--tls-private-key-file", files["tls.key"], "--sandboxd-token-file", files["token"],
		"--log-format", "text")
	d := hosttest.NewDaemon(t, dir, "sandbox-apiserver", bin, args...)
	d.Start()
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	scheme := deploy.NewScheme()
	if err := sbv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := deploy.WaitAvailable(waitCtx, admin); err != nil {
		t.Fatal(err)
	}
	t.Logf("APIService %s Available %s after the replica started", deploy.APIServiceName, time.Since(start).Round(time.Millisecond))
	var list sbv1.SandboxList
	if err := admin.List(ctx, &list); err != nil {
		t.Fatalf("list sandboxes through the aggregator: %v", err)
	}
	if len(list.Items) != 0 {
		t.Errorf("sandboxes on a fleet of no hosts: %d", len(list.Items))
	}
	checkAlertMetrics(t, adminAddr, "skiff_apiserver_")
}

// containerArgs are the first container's command arguments of the
// rendered workload.
func containerArgs(t *testing.T, objs []*unstructured.Unstructured, kind, name string) []string {
	t.Helper()
	obj := find(objs, kind, namespace, name)
	if obj == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if len(containers) == 0 {
		t.Fatalf("%s %s has no containers", kind, name)
	}
	raw, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	return raw
}
