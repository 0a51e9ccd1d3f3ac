package kubetest

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/policies"
	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Policies returns the objects embedded in api/policies, decoded strictly
// with scheme (which must know admissionregistration.k8s.io/v1 and
// rbac.authorization.k8s.io/v1), in file-name order.
func Policies(scheme *runtime.Scheme) ([]client.Object, error) {
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	var out []client.Object
	err := fs.WalkDir(policies.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		data, err := fs.ReadFile(policies.FS, path)
		if err != nil {
			return err
		}
		obj, _, err := dec.Decode(data, nil, nil)
		if err != nil {
			return fmt.Errorf("decode %s: %w", path, err)
		}
		co, ok := obj.(client.Object)
		if !ok {
			return fmt.Errorf("decode %s: %T is not an object", path, obj)
		}
		out = append(out, co)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read embedded policies: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("read embedded policies: none found")
	}
	return out, nil
}

// InstallRBAC creates only the ClusterRole and ClusterRoleBinding of
// api/policies: the cluster before its operator installs the admission
// policy, where RBAC alone lets any host write any host's NodeInventory.
func (e *Env) InstallRBAC(t testing.TB) {
	t.Helper()
	objs, err := Policies(e.Scheme)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	for _, obj := range objs {
		switch obj.(type) {
		case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			if err := e.Client.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("kubetest: install %T %s: %v", obj, obj.GetName(), err)
			}
		}
	}
}

// InstallPolicies creates the objects of api/policies (leaving those that
// exist already) and waits until the admission policy is in force: until a
// host's identity is refused another host's NodeInventory (a dry run:
// nothing is written) and allowed its own. (The kube-apiserver holds the
// first request the policy matches for about 2 s while it loads it.)
func (e *Env) InstallPolicies(t testing.TB) {
	t.Helper()
	objs, err := Policies(e.Scheme)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	start := time.Now()
	for _, obj := range objs {
		if err := e.Client.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("kubetest: install %T %s: %v", obj, obj.GetName(), err)
		}
	}
	const probe = "kubetest-probe"
	host := e.NodeUser(t, probe).Client
	dryRun := func(name string) error {
		return host.Create(t.Context(), probeInventory(name), client.DryRunAll)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := dryRun(probe + "-other")
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), policies.PolicyName) {
			break
		}
		if err != nil && !apierrors.IsForbidden(err) {
			t.Fatalf("kubetest: probe %s: %v", policies.PolicyName, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubetest: %s not in force within 30s (last probe: %v)", policies.PolicyName, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := dryRun(probe); err != nil {
		t.Fatalf("kubetest: a host's own NodeInventory refused with %s in force: %v", policies.PolicyName, err)
	}
	t.Logf("kubetest: %s in force in %s", policies.PolicyName, time.Since(start).Round(time.Millisecond))
}

// probeInventory is the smallest valid NodeInventory.
func probeInventory(name string) *v1beta1.NodeInventory {
	return &v1beta1.NodeInventory{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: "127.0.0.1:1",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 1, MemoryMiB: 1, Sandboxes: 1},
		},
	}
}
