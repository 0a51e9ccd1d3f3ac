package kubeinventory_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
)

const fieldOwner = client.FieldOwner("vk-sandbox")

// publish server-side-applies an inventory stamped now, as vk-sandbox does.
func publish(ctx context.Context, c client.Client, name string) error {
	inv := &v1beta1.NodeInventory{
		TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta:  metav1.ObjectMeta{Name: name},
		PublishedAt: &metav1.Time{Time: time.Now()},
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: "127.0.0.1:27777",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 4000, MemoryMiB: 8192, Sandboxes: 10},
			Sandboxes: []v1beta1.SandboxEntry{{
				ID: strings.Repeat("w", 16) + name[len(name)-4:], Template: "base", State: v1beta1.SandboxWarm,
				StartedAt: v1beta1.NewMicroTime(time.Now()),
			}},
		},
	}
	//nolint:staticcheck // client.Apply with a typed object is how vk-sandbox publishes until it moves to apply configurations.
	return c.Patch(ctx, inv, client.Apply, fieldOwner, client.ForceOwnership)
}

// Two hosts publish to a real kube-apiserver; one stops. Read through an
// informer cache, the stopped one leaves ListNodes (and lookups, and warm
// candidates) once the live one has published past the window, while the
// live one stays throughout.
func TestControlPlaneStoppedPublisherLeaves(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()

	// The stamp survives the CRD (an old CRD would prune it) and the schema
	// rejects a stamp that is not a date-time.
	if err := publish(ctx, env.Client, "node-live"); err != nil {
		t.Fatalf("publish node-live: %v", err)
	}
	if err := publish(ctx, env.Client, "node-dead"); err != nil {
		t.Fatalf("publish node-dead: %v", err)
	}
	got := &v1beta1.NodeInventory{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-dead"}, got); err != nil {
		t.Fatal(err)
	}
	if got.PublishedAt == nil {
		t.Fatal("publishedAt was pruned: the installed CRD does not know the field")
	}
	bad := []byte(`{"apiVersion":"skiff.dev/v1beta1","kind":"NodeInventory","metadata":{"name":"node-dead"},"publishedAt":"yesterday"}`)
	err := env.Client.Patch(ctx, got, client.RawPatch("application/merge-patch+json", bad))
	if !apierrors.IsInvalid(err) {
		t.Fatalf("patch publishedAt=yesterday: err = %v, want Invalid", err)
	}

	// Readers see the fleet through an informer cache, as in production.
	c := env.StartCache(t, &v1beta1.NodeInventory{})

	opts := kubeinventory.NewOptions()
	opts.StaleAfter = 3 * time.Second
	src := kubeinventory.New(c, opts)

	names := func() []string {
		invs, err := src.ListNodes(ctx)
		if err != nil {
			t.Fatalf("ListNodes: %v", err)
		}
		var out []string
		for _, inv := range invs {
			out = append(out, inv.Name)
		}
		slices.Sort(out)
		return out
	}
	waitFor := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := names()
			if slices.Equal(got, want) {
				return
			}
			if !slices.Contains(got, "node-live") {
				t.Fatalf("ListNodes = %v: the live node left", got)
			}
			if time.Now().After(deadline) {
				t.Fatalf("ListNodes = %v, want %v within 30s", got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("node-dead", "node-live")
	if _, err := src.NodeInventory(ctx, "node-dead"); err != nil {
		t.Fatalf("NodeInventory(node-dead) while fresh = %v", err)
	}

	// node-live keeps publishing every 500ms; node-dead never again.
	pubCtx, stopPublishing := context.WithCancel(ctx)
	var pubErr error
	var pubWG sync.WaitGroup
	pubWG.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-pubCtx.Done():
				return
			case <-tick.C:
				if err := publish(pubCtx, env.Client, "node-live"); err != nil && pubCtx.Err() == nil {
					pubErr = fmt.Errorf("publish node-live: %w", err)
					return
				}
			}
		}
	})
	start := time.Now()
	waitFor("node-live")
	stopPublishing()
	pubWG.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	if left := time.Since(start); left < opts.StaleAfter {
		t.Fatalf("node-dead left after %s, before the %s window", left, opts.StaleAfter)
	}

	if _, err := src.NodeInventory(ctx, "node-dead"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInventory(node-dead) = %v, want NotFound", err)
	}
	if _, err := src.NodeCapacity(ctx, "node-live"); err != nil {
		t.Fatalf("NodeCapacity(node-live) = %v", err)
	}
	cands, err := src.WarmCandidates(ctx, "base", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || cands[0].Node != "node-live" {
		t.Fatalf("WarmCandidates = %+v, want node-live's one warm sandbox", cands)
	}

	// Once every publisher has stopped, nothing else leaves: the reference
	// stays with the newest stamp.
	time.Sleep(2 * opts.StaleAfter)
	waitFor("node-live")
}
