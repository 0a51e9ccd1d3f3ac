package kubetest_test

import (
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// The CRDs in api/crds, installed on a real kube-apiserver, enforce what the
// types document.
func TestCRDsOnControlPlane(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	c := env.Client
	now := metav1.Now()

	inventory := func(mut func(*v1beta1.NodeInventory)) *v1beta1.NodeInventory {
		inv := &v1beta1.NodeInventory{
			ObjectMeta:  metav1.ObjectMeta{GenerateName: "node-"},
			PublishedAt: &now,
			Spec: v1beta1.NodeInventorySpec{
				Endpoint: "10.0.0.1:27777",
				Capacity: v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 4},
				Sandboxes: []v1beta1.SandboxEntry{{
					ID: "abcdefghij0123456789", Template: "base", State: v1beta1.SandboxRunning, Team: "team-a",
					StartedAt: v1beta1.NewMicroTime(now.Time), Metadata: map[string]string{"user": "alice"},
				}},
			},
		}
		if mut != nil {
			mut(inv)
		}
		return inv
	}
	template := func(mut func(*v1beta1.SandboxTemplate)) *v1beta1.SandboxTemplate {
		tpl := &v1beta1.SandboxTemplate{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "tpl-"},
			Spec:       v1beta1.SandboxTemplateSpec{Source: v1beta1.TemplateSource{Builtin: "base"}},
		}
		if mut != nil {
			mut(tpl)
		}
		return tpl
	}

	for _, tc := range []struct {
		name    string
		obj     client.Object
		wantErr string // empty: accepted
	}{
		{"valid inventory", inventory(nil), ""},
		{"bad sandbox ID", inventory(func(i *v1beta1.NodeInventory) { i.Spec.Sandboxes[0].ID = "Not-An-ID" }), "spec.sandboxes[0].id"},
		{"bad state", inventory(func(i *v1beta1.NodeInventory) { i.Spec.Sandboxes[0].State = "gone" }), "spec.sandboxes[0].state"},
		{"running without team", inventory(func(i *v1beta1.NodeInventory) { i.Spec.Sandboxes[0].Team = "" }), "belongs to a team"},
		{"warm without team", inventory(func(i *v1beta1.NodeInventory) {
			i.Spec.Sandboxes[0].Team, i.Spec.Sandboxes[0].State = "", v1beta1.SandboxWarm
		}), ""},
		{"endpoint without port", inventory(func(i *v1beta1.NodeInventory) { i.Spec.Endpoint = "10.0.0.1" }), "spec.endpoint"},
		{"negative capacity", inventory(func(i *v1beta1.NodeInventory) { i.Spec.Capacity.CPUMilli = -1 }), "spec.capacity.cpuMilli"},
		{"metadata over its bound", inventory(func(i *v1beta1.NodeInventory) {
			i.Spec.Sandboxes[0].Metadata = map[string]string{"a": strings.Repeat("x", 100), "b": strings.Repeat("y", 100)}
		}), "at most 192 bytes together"},
		{"metadata key too long", inventory(func(i *v1beta1.NodeInventory) {
			i.Spec.Sandboxes[0].Metadata = map[string]string{strings.Repeat("k", 65): "v"}
		}), "keys are at most 64 bytes"},
		{"metadata with too many entries", inventory(func(i *v1beta1.NodeInventory) {
			i.Spec.Sandboxes[0].Metadata = map[string]string{"1": "", "2": "", "3": "", "4": "", "5": "", "6": "", "7": "", "8": "", "9": ""}
		}), "spec.sandboxes[0].metadata"},
		// spec.sandboxes is an atomic list (its managed fields stay small),
		// so the schema no longer refuses a repeated ID: its one writer,
		// vk-sandbox, builds the list from a map keyed by ID.
		{"duplicate sandbox IDs", inventory(func(i *v1beta1.NodeInventory) {
			i.Spec.Sandboxes = append(i.Spec.Sandboxes, i.Spec.Sandboxes[0])
		}), ""},
		{"valid template", template(nil), ""},
		{"template with two sources", template(func(t *v1beta1.SandboxTemplate) { t.Spec.Source.Directory = "/srv/rootfs" }), "exactly one of image, directory and builtin"},
		{"template with no source", template(func(t *v1beta1.SandboxTemplate) { t.Spec.Source = v1beta1.TemplateSource{} }), "exactly one of image, directory and builtin"},
		{"template with a relative directory", template(func(t *v1beta1.SandboxTemplate) {
			t.Spec.Source = v1beta1.TemplateSource{Directory: "rootfs"}
		}), "spec.source.directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Create(ctx, tc.obj)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("create: %v, want accepted", err)
			case tc.wantErr != "" && !apierrors.IsInvalid(err):
				t.Fatalf("create: err = %v, want Invalid", err)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("create: err = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}

	// An entry's times keep their microseconds on the server; one in whole
	// seconds, as an older host wrote it, is taken and read back.
	start := time.Date(2026, 12, 5, 10, 0, 1, 20_345_000, time.UTC)
	inv := inventory(func(i *v1beta1.NodeInventory) {
		end := v1beta1.NewMicroTime(start.Add(time.Hour))
		i.Spec.Sandboxes[0].StartedAt, i.Spec.Sandboxes[0].EndAt = v1beta1.NewMicroTime(start), &end
	})
	if err := c.Create(ctx, inv); err != nil {
		t.Fatal(err)
	}
	var back v1beta1.NodeInventory
	if err := c.Get(ctx, client.ObjectKeyFromObject(inv), &back); err != nil {
		t.Fatal(err)
	}
	if e := back.Spec.Sandboxes[0]; !e.StartedAt.Time.Equal(start) || e.EndAt == nil || !e.EndAt.Time.Equal(start.Add(time.Hour)) {
		t.Fatalf("stored times %v, %v; want %v and an hour later", e.StartedAt, e.EndAt, start)
	}
	old := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1beta1.GroupVersion.String(), "kind": "NodeInventory",
		"metadata": map[string]any{"generateName": "node-"},
		"spec": map[string]any{
			"endpoint": "10.0.0.1:27777",
			"capacity": map[string]any{"cpuMilli": int64(1000), "memoryMiB": int64(1024), "sandboxes": int64(4)},
			"sandboxes": []any{map[string]any{"id": "abcdefghij0123456789", "template": "base", "state": "running", "team": "team-a",
				"startedAt": "2026-12-05T10:00:01Z", "endAt": "2026-12-05T11:00:01Z"}},
		},
	}}
	if err := c.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(old), &back); err != nil {
		t.Fatalf("an entry in whole seconds: %v", err)
	}
	if e := back.Spec.Sandboxes[0]; !e.StartedAt.Time.Equal(start.Truncate(time.Second)) {
		t.Fatalf("an entry in whole seconds read as %v", e.StartedAt)
	}

	// Template defaults come from the schema.
	tpl := template(nil)
	if err := c.Create(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if tpl.Spec.CPUMilli != 1000 || tpl.Spec.MemoryMiB != 512 || tpl.Spec.EnvdVersion != "0.6.0" {
		t.Fatalf("template defaults = %+v, want 1000m, 512Mi, envd 0.6.0", tpl.Spec)
	}

	// A warm pool scales through its scale subresource, keeps its template,
	// and has a status subresource.
	pool := &v1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: "base", Namespace: "default"},
		Spec:       v1beta1.SandboxWarmPoolSpec{Template: "base"},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if pool.Spec.Replicas == nil || *pool.Spec.Replicas != 1 {
		t.Fatalf("replicas = %v, want the default 1", pool.Spec.Replicas)
	}
	scale := &autoscalingv1.Scale{}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":5}}`))
	if err := c.SubResource("scale").Patch(ctx, pool, patch, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("patch scale: %v", err)
	}
	if scale.Spec.Replicas != 5 {
		t.Fatalf("scale = %+v, want 5 replicas", scale.Spec)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "base"}, pool); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(pool.Spec.Replicas, 0); got != 5 {
		t.Fatalf("replicas after scale = %d, want 5", got)
	}
	pool.Status = v1beta1.SandboxWarmPoolStatus{Replicas: 3, Ready: 2, Warming: 1, Selector: "skiff.dev/pool=base", Conditions: []metav1.Condition{{
		Type: v1beta1.SandboxWarmPoolConditionReady, Status: metav1.ConditionFalse, Reason: "Warming",
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second)),
	}}}
	if err := c.Status().Update(ctx, pool); err != nil {
		t.Fatalf("update status: %v", err)
	}
	// The scale subresource reports status.selector: an HPA scales only a
	// target whose scale has a selector.
	if err := c.SubResource("scale").Get(ctx, pool, scale); err != nil {
		t.Fatalf("get scale: %v", err)
	}
	if scale.Status.Replicas != 3 || scale.Status.Selector != "skiff.dev/pool=base" {
		t.Fatalf("scale status = %+v, want 3 replicas and the selector skiff.dev/pool=base", scale.Status)
	}
	// A pool's name is its sandboxes' label value: at most 63 characters.
	long := &v1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("p", 64), Namespace: "default"},
		Spec:       v1beta1.SandboxWarmPoolSpec{Template: "base"},
	}
	if err := c.Create(ctx, long); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "at most 63 characters") {
		t.Fatalf("create a pool of a 64-character name: err = %v, want Invalid", err)
	}
	pool.Spec.Template = "other"
	if err := c.Update(ctx, pool); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "template is immutable") {
		t.Fatalf("change template: err = %v, want Invalid (immutable)", err)
	}
}

// A host publishes its inventory by server-side apply, over and over; one
// whose sandboxes are all gone applies an allocation of zero, and that must
// be accepted (an allocation of all zeros once serialised as {}, which the
// apply merge turned into null and the schema refused, freezing the host's
// publishedAt).
func TestInventoryAllocationBackToZero(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	apply := func(allocated v1beta1.NodeCapacity) error {
		now := metav1.Now()
		inv := &v1beta1.NodeInventory{
			TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
			ObjectMeta:  metav1.ObjectMeta{Name: "host-zero"},
			PublishedAt: &now,
			Spec: v1beta1.NodeInventorySpec{
				Endpoint:  "10.0.0.1:27777",
				Capacity:  v1beta1.NodeCapacity{CPUMilli: 1000, MemoryMiB: 1024, Sandboxes: 4},
				Allocated: allocated,
			},
		}
		//nolint:staticcheck // client.Apply with a typed object, as the publisher does.
		return env.Client.Patch(ctx, inv, client.Apply, client.FieldOwner("vk-sandbox"), client.ForceOwnership)
	}
	for i, allocated := range []v1beta1.NodeCapacity{
		{CPUMilli: 2000, MemoryMiB: 512, Sandboxes: 1},
		{},
		{CPUMilli: 1000, MemoryMiB: 256, Sandboxes: 1},
		{},
	} {
		if err := apply(allocated); err != nil {
			t.Fatalf("apply %d (allocated %+v): %v", i, allocated, err)
		}
		var got v1beta1.NodeInventory
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "host-zero"}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.Allocated != allocated {
			t.Fatalf("apply %d: allocated is %+v, want %+v", i, got.Spec.Allocated, allocated)
		}
	}
}
