package kubetest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/policies"
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// apply server-side-applies node's inventory naming endpoint, as
// vk-sandbox publishes.
func apply(ctx context.Context, c client.Client, node, endpoint string) error {
	inv := &v1beta1.NodeInventory{
		TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta:  metav1.ObjectMeta{Name: node},
		PublishedAt: &metav1.Time{Time: time.Now()},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: endpoint,
			Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 4},
		},
	}
	//nolint:staticcheck // client.Apply with a typed object is how vk-sandbox publishes until it moves to apply configurations.
	return c.Patch(ctx, inv, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership)
}

// update rewrites node's inventory's endpoint with a read and an update.
func update(ctx context.Context, c client.Client, node, endpoint string) error {
	var inv v1beta1.NodeInventory
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &inv); err != nil {
		return err
	}
	inv.Spec.Endpoint = endpoint
	return c.Update(ctx, &inv)
}

func remove(ctx context.Context, c client.Client, node string) error {
	return c.Delete(ctx, &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: node}})
}

// applyShard server-side-applies the shard named name, of node, as
// vk-sandbox publishes one.
func applyShard(ctx context.Context, c client.Client, name, node string, index int32) error {
	sh := &v1beta1.NodeInventoryShard{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventoryShard"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1beta1.NodeInventoryShardSpec{Node: node, Index: index},
	}
	//nolint:staticcheck // as apply
	return c.Patch(ctx, sh, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership)
}

func removeShard(ctx context.Context, c client.Client, name string) error {
	return c.Delete(ctx, &v1beta1.NodeInventoryShard{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// The attack of issue 14, point 10, on a real kube-apiserver: with only
// RBAC, host-a's identity rewrites host-b's NodeInventory to host-a's
// endpoint (where the readers would then send host-b's traffic and node
// token), updates it and deletes it. With api/policies installed each of
// those is refused, saying why, while host-a still publishes its own and an
// admin is unaffected.
func TestPolicyBindsEachInventoryToItsHost(t *testing.T) {
	env := kubetest.StartWith(t, kubetest.Options{NoPolicies: true})
	ctx := t.Context()
	env.InstallRBAC(t) // as a cluster without the policy has it
	// More than the shipped role grants (which is create and patch), as an
	// operator might: the policy must hold whatever RBAC allows.
	grant(t, env, "test:more-than-publish", rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: policies.NodesGroup},
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: policies.NodeUser("host-x")})

	admin := env.Client
	hostA, hostB := env.NodeUser(t, "host-a").Client, env.NodeUser(t, "host-b").Client
	// Named like a host but not in the group; in the group but not named like one.
	namedOnly := env.AddUser(t, policies.NodeUser("host-x")).Client
	groupOnly := env.AddUser(t, "mallory", policies.NodesGroup).Client
	const endpointA, endpointB = "10.0.0.1:27777", "10.0.0.2:27777"

	type step struct {
		name   string
		do     func() error
		denied bool // by the policy, with its message
	}
	run := func(phase string, steps []step) {
		t.Helper()
		for _, s := range steps {
			err := s.do()
			switch {
			case !s.denied && err != nil:
				t.Errorf("%s: %s: %v", phase, s.name, err)
			case s.denied && !apierrors.IsForbidden(err):
				t.Errorf("%s: %s: got %v, want Forbidden", phase, s.name, err)
			case s.denied && !strings.Contains(err.Error(), "a sandbox host (group skiff:nodes) writes only the NodeInventory named after its own node"):
				t.Errorf("%s: %s: %v, want the policy's message", phase, s.name, err)
			}
		}
	}
	endpointOf := func(node string) string {
		t.Helper()
		var inv v1beta1.NodeInventory
		if err := admin.Get(ctx, client.ObjectKey{Name: node}, &inv); err != nil {
			t.Fatalf("get %s: %v", node, err)
		}
		return inv.Spec.Endpoint
	}

	// Before: the attack works.
	run("without the policy", []step{
		{name: "host-a applies its own", do: func() error { return apply(ctx, hostA, "host-a", endpointA) }},
		{name: "host-b applies its own", do: func() error { return apply(ctx, hostB, "host-b", endpointB) }},
		{name: "host-a applies host-b's with its endpoint", do: func() error { return apply(ctx, hostA, "host-b", endpointA) }},
	})
	if got := endpointOf("host-b"); got != endpointA {
		t.Fatalf("without the policy host-b's endpoint is %s, want host-a's %s: the attack did not reproduce", got, endpointA)
	}
	run("without the policy", []step{
		{name: "host-a updates host-b's", do: func() error { return update(ctx, hostA, "host-b", endpointA) }},
		{name: "host-a deletes host-b's", do: func() error { return remove(ctx, hostA, "host-b") }},
		{name: "host-a invents host-c", do: func() error { return apply(ctx, hostA, "host-c", endpointA) }},
	})

	env.InstallPolicies(t)
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	if err := admin.Get(ctx, client.ObjectKey{Name: policies.PolicyName}, &vap); err != nil {
		t.Fatal(err)
	}
	if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
		t.Errorf("the policy's CEL does not type-check: %+v", tc.ExpressionWarnings)
	}

	// After: each host writes only its own; an admin anything.
	run("with the policy", []step{
		{name: "host-b applies its own", do: func() error { return apply(ctx, hostB, "host-b", endpointB) }},
		{name: "host-a applies its own", do: func() error { return apply(ctx, hostA, "host-a", endpointA) }},
		{name: "host-a updates its own", do: func() error { return update(ctx, hostA, "host-a", endpointA) }},
		{name: "host-a applies host-b's", do: func() error { return apply(ctx, hostA, "host-b", endpointA) }, denied: true},
		{name: "host-a updates host-b's", do: func() error { return update(ctx, hostA, "host-b", endpointA) }, denied: true},
		{name: "host-a deletes host-b's", do: func() error { return remove(ctx, hostA, "host-b") }, denied: true},
		{name: "host-a creates host-d", do: func() error { return apply(ctx, hostA, "host-d", endpointA) }, denied: true},
		{name: "a user named like a host applies host-b's", do: func() error { return apply(ctx, namedOnly, "host-b", endpointA) }, denied: true},
		{name: "a user of the hosts' group applies host-b's", do: func() error { return apply(ctx, groupOnly, "host-b", endpointA) }, denied: true},
		{name: "a user of the hosts' group applies its own name", do: func() error { return apply(ctx, groupOnly, "mallory", endpointA) }, denied: true},
		{name: "an admin applies host-e", do: func() error { return apply(ctx, admin, "host-e", endpointA) }},
		{name: "an admin updates host-e", do: func() error { return update(ctx, admin, "host-e", endpointB) }},
		{name: "an admin deletes host-e", do: func() error { return remove(ctx, admin, "host-e") }},
		{name: "host-a deletes its own", do: func() error { return remove(ctx, hostA, "host-a") }},
	})
	if got := endpointOf("host-b"); got != endpointB {
		t.Errorf("with the policy host-b's endpoint is %s, want its own %s", got, endpointB)
	}

	// The shards that hold a host's sandboxes are bound the same way.
	run("shards, with the policy", []step{
		{name: "host-a applies its shard", do: func() error { return applyShard(ctx, hostA, "host-a-s0", "host-a", 0) }},
		{name: "host-b applies its shard", do: func() error { return applyShard(ctx, hostB, "host-b-s3", "host-b", 3) }},
		{name: "host-a applies host-b's shard", do: func() error { return applyShard(ctx, hostA, "host-b-s3", "host-b", 3) }, denied: true},
		{name: "host-a deletes host-b's shard", do: func() error { return removeShard(ctx, hostA, "host-b-s3") }, denied: true},
		{name: "a user of the hosts' group applies host-b's shard", do: func() error { return applyShard(ctx, groupOnly, "host-b-s1", "host-b", 1) }, denied: true},
		{name: "an admin applies host-b's shard", do: func() error { return applyShard(ctx, admin, "host-b-s1", "host-b", 1) }},
		{name: "host-a deletes its shard", do: func() error { return removeShard(ctx, hostA, "host-a-s0") }},
	})
	// A shard's name is tied to its node: host-a cannot write host-b's
	// shard by naming itself in it.
	for _, name := range []string{"host-b-s3", "host-b-s9"} {
		if err := applyShard(ctx, hostA, name, "host-a", 3); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "a shard's name is its node's name") {
			t.Errorf("host-a applies %s naming itself: got %v, want Invalid with the policy's message", name, err)
		}
	}
	var sh v1beta1.NodeInventoryShard
	if err := admin.Get(ctx, client.ObjectKey{Name: "host-b-s3"}, &sh); err != nil || sh.Spec.Node != "host-b" {
		t.Errorf("host-b's shard after the attempts: %+v, %v; want it host-b's", sh.Spec, err)
	}
}

// grant binds subjects to every verb on nodeinventories and their shards.
func grant(t *testing.T, env *kubetest.Env, name string, subjects ...rbacv1.Subject) {
	t.Helper()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1beta1.GroupVersion.Group}, Resources: []string{"nodeinventories", "nodeinventoryshards"}, Verbs: []string{"*"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   subjects,
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
}
