package kubeinventory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	skiffpublish "github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// BenchmarkListNodesSharedSharded measures a list of the fleet as the
// servers' readers make it on every inventory event: 200 hosts of 16
// packed shards each (3,200 shards) in a real kube-apiserver, read
// through an informer cache, no host changed since the last list:
//
//   - every-shard: a Source that reads every shard on every list (a copy
//     of each from the cache), as the readers did;
//   - tracked: a Source told of shard events (TrackShardEvents), as the
//     servers' is now: it reads the shards of no host;
//   - tracked-one-event: the same, after a shard event of one host, whose
//     16 shards it reads again (a host's fold).
func BenchmarkListNodesSharedSharded(b *testing.B) {
	const hosts, perHost = 200, 64
	env := kubetest.Start(b)
	ctx := b.Context()
	w := skiffpublish.NewKubeWriter(dynamic.NewForConfigOrDie(env.Config), skiffpublish.Options{SandboxShards: 16, ShardFormat: skiffpublish.ShardsPacked})
	start := time.Now()
	inParallel(b, hosts, func(i int) error { return w.Apply(ctx, shardedHost(fmt.Sprintf("bench-host-%03d", i), perHost)) })
	c := env.StartCache(b, &v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{})
	b.Logf("published %d hosts of %d shards and synced a cache in %s", hosts, 16, time.Since(start).Round(time.Millisecond))
	var one v1beta1.NodeInventoryShard
	if err := c.Get(ctx, clientKey(v1beta1.ShardName("bench-host-007", 3)), &one); err != nil {
		b.Fatal(err)
	}

	everyShard := kubeinventory.New(c, kubeinventory.NewOptions())
	tracked := trackedSource(b, c, c, kubeinventory.NewOptions())
	list := func(b *testing.B, src *kubeinventory.Source) {
		invs, err := src.ListNodesShared(context.Background())
		if err != nil || len(invs) != hosts || len(invs[0].Spec.Sandboxes) != perHost {
			b.Fatalf("listed %d hosts (%v), want %d of %d sandboxes", len(invs), err, hosts, perHost)
		}
	}
	for _, bc := range []struct {
		name   string
		src    *kubeinventory.Source
		before func()
	}{
		{"every-shard", everyShard, nil},
		{"tracked", tracked, nil},
		{"tracked-one-event", tracked, func() { tracked.ShardEvent(&one) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			list(b, bc.src) // the first join of every host
			b.ReportAllocs()
			for b.Loop() {
				if bc.before != nil {
					bc.before()
				}
				list(b, bc.src)
			}
		})
	}
}

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }
