package provider

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "1", "B": "two"}
	tests := map[string]string{
		"plain":          "plain",
		"$(A)":           "1",
		"x$(A)y$(B)z":    "x1ytwoz",
		"$(C)":           "$(C)",
		"$$(A)":          "$(A)",
		"$$":             "$",
		"cost: $5":       "cost: $5",
		"$(A":            "$(A",
		"end$":           "end$",
		"$(A)$(A)$$$(B)": "11$two",
	}
	for in, want := range tests {
		if got := expand(in, env); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// The environment of a pod's container, resolved as the kubelet resolves
// it, with the ConfigMaps and Secrets read from a real kube-apiserver.
func TestResolveEnv(t *testing.T) {
	env := kubetest.Start(t)
	kube := kubernetes.NewForConfigOrDie(env.Config)
	ctx := t.Context()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps("team-a").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"},
		Data: map[string]string{"MODE": "fast", "not-a-name": "skipped", "LEVEL": "3"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets("team-a").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data: map[string][]byte{"token": []byte("s3cr3t")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	yes := true
	pod := testPod(func(p *corev1.Pod) {
		p.Labels = map[string]string{"app": "agent"}
		p.Spec.NodeName = "host-a"
		c := &p.Spec.Containers[0]
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
		c.EnvFrom = []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}},
			{Prefix: "OPT_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: &yes}},
		}
		c.Env = []corev1.EnvVar{
			{Name: "MODE", Value: "slow"}, // env wins over envFrom
			{Name: "GREETING", Value: "hello $(POD_NAME)"},
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "URL", Value: "http://$(POD_NAME).$(NS)/"},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "requests.cpu"}}},
			{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
			{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
			{Name: "MAYBE", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: &yes}}},
			{Name: "LVL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "LEVEL"}}},
		}
	})
	got, err := resolveEnv(ctx, kube.CoreV1(), pod, &pod.Spec.Containers[0], "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"MODE": "slow", "LEVEL": "3", "GREETING": "hello $(POD_NAME)", "POD_NAME": "p", "URL": "http://p.$(NS)/", "NS": "team-a",
		"APP": "agent", "NODE": "host-a", "HOST_IP": "192.0.2.1", "CPU": "2", "MEM_MI": "256", "TOKEN": "s3cr3t", "LVL": "3",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}

	// A missing required reference is an error to retry (it may be made
	// yet); a field vk-sandbox cannot give is an invalid pod.
	missing := testPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}}}
	})
	if _, err := resolveEnv(ctx, kube.CoreV1(), missing, &missing.Spec.Containers[0], ""); err == nil || errors.Is(err, errInvalidPod) {
		t.Errorf("missing secret: %v, want a retryable error", err)
	}
	unsupported := testPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.hostname"}}}}
	})
	if _, err := resolveEnv(ctx, kube.CoreV1(), unsupported, &unsupported.Spec.Containers[0], ""); !errors.Is(err, errInvalidPod) {
		t.Errorf("unsupported field: %v, want errInvalidPod", err)
	}
	badName := testPod(func(p *corev1.Pod) { p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A-B", Value: "x"}} })
	if _, err := resolveEnv(ctx, kube.CoreV1(), badName, &badName.Spec.Containers[0], ""); !errors.Is(err, errInvalidPod) {
		t.Errorf("bad name: %v, want errInvalidPod", err)
	}
}
