package publish

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// BenchmarkShardWriteServerCost measures what rewriting one shard of a
// 2,000-sandbox host (125 entries, one changed) costs kube-apiserver and
// etcd, by how it is written, to tell where the per-entry cost of a write
// goes (BenchmarkWriteServerCost: about 0.3 ms of kube-apiserver CPU per
// entry):
//
//   - apply: server-side apply of the NodeInventoryShard, as KubeWriter
//     writes it (the managed fields list every field of every entry);
//   - update: a PUT of the same object, preconditioned on its
//     resourceVersion (managed fields for the update operation);
//   - opaque: the same entries as one JSON string in a scratch custom
//     resource whose schema is that one string field, PUT: what the
//     apiserver costs when it does not see the entries' structure.
//
// With PPROF_OUT=file it also writes kube-apiserver's CPU profile of 10 s
// of update.
func BenchmarkShardWriteServerCost(b *testing.B) {
	env := kubetest.Start(b)
	etcdPID, apiPID, err := env.PIDs()
	if err != nil {
		b.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	ctx := b.Context()
	blobs := opaqueResource(b, env, dyn)
	entries := costInventory("shardcost", 2000).Spec.Sandboxes[:2000/DefaultSandboxShards]
	shards := dyn.Resource(v1beta1.GroupVersion.WithResource("nodeinventoryshards"))

	change := func(i int) {
		end := v1beta1.NewMicroTime(entries[i%len(entries)].EndAt.Add(time.Second))
		entries[i%len(entries)].EndAt = &end
	}
	shardObject := func(name string) *unstructured.Unstructured {
		sh := &v1beta1.NodeInventoryShard{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventoryShard"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       v1beta1.NodeInventoryShardSpec{Node: "shardcost", Index: 0, Sandboxes: entries},
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sh)
		if err != nil {
			b.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		return u
	}
	blobObject := func(name string) *unstructured.Unstructured {
		raw, err := json.Marshal(entries)
		if err != nil {
			b.Fatal(err)
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "bench.skiff.dev/v1", "kind": "Blob",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"sandboxes": string(raw)},
		}}
	}
	put := func(res dynamic.ResourceInterface, make func(string) *unstructured.Unstructured, name string) func(context.Context) error {
		rv := ""
		return func(ctx context.Context) error {
			u := make(name)
			if rv == "" {
				out, err := res.Create(ctx, u, metav1.CreateOptions{FieldManager: FieldManager})
				if err != nil {
					return err
				}
				rv = out.GetResourceVersion()
				return nil
			}
			u.SetResourceVersion(rv)
			out, err := res.Update(ctx, u, metav1.UpdateOptions{FieldManager: FieldManager})
			if err != nil {
				return err
			}
			rv = out.GetResourceVersion()
			return nil
		}
	}
	for _, bc := range []struct {
		name  string
		write func(context.Context) error
	}{
		{"apply", func(ctx context.Context) error {
			_, err := shards.Apply(ctx, "shardcost-apply-s0", shardObject("shardcost-apply-s0"), metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
			return err
		}},
		{"update", put(shards, shardObject, "shardcost-update-s0")},
		{"opaque", put(blobs, blobObject, "shardcost-opaque")},
	} {
		if err := bc.write(ctx); err != nil { // created outside the measure
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			if bc.name == "update" {
				profileKubeAPIServer(b, env, 10)
			}
			measureServerCost(b, apiPID, etcdPID, func(ctx context.Context, i int) error {
				change(i)
				return bc.write(ctx)
			})
		})
	}
}

// opaqueResource installs a scratch cluster-scoped custom resource whose
// spec is one string, and returns its client.
func opaqueResource(b *testing.B, env *kubetest.Env, dyn dynamic.Interface) dynamic.ResourceInterface {
	b.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "blobs.bench.skiff.dev"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "bench.skiff.dev",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "blobs", Singular: "blob", Kind: "Blob", ListKind: "BlobList"},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"sandboxes": {Type: "string"}}},
					},
				}},
			}},
		},
	}
	cs := apiextensionsclient.NewForConfigOrDie(env.Config)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(b.Context(), crd, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	res := dyn.Resource(schema.GroupVersionResource{Group: "bench.skiff.dev", Version: "v1", Resource: "blobs"})
	err := wait.PollUntilContextTimeout(b.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := res.List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		b.Fatalf("the scratch resource never served: %v", err)
	}
	return res
}
