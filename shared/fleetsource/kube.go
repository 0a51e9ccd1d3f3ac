package fleetsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/serverclock"
)

// KubeFleet is kube mode's fleet: one informer cache that holds the
// NodeInventory objects (and whatever else the binary watches), and the
// fleet read from it through kubeinventory's freshness filter.
//
// Open it with OpenKube; add the binary's own indexes and event handlers to
// Cache; then Start it, which returns once the cache has listed everything
// it watches (the readers' readiness gate in kube mode). Stop ends it.
type KubeFleet struct {
	// Cache is the informer cache. The binary configures it (OpenKube's
	// opts: its scheme, its transforms) and may read the other kinds it
	// watches through it.
	Cache cache.Cache
	// Source is the fleet: the cache's NodeInventories, freshness-filtered.
	Source *kubeinventory.Source

	host  string
	kinds []string

	cancel context.CancelFunc
	wg     sync.WaitGroup
	err    error // the cache's, once it stopped
}

// OpenKube builds the informer cache at cfg with opts and opens an informer
// for NodeInventory, NodeInventoryShard and each of also, so that a kind whose CRD is not
// installed is named as such now rather than at sync. stale is the
// freshness filter. Unless opts sets NewInformer, the informers retry the
// lists and watches a kube-apiserver out of reach or starting fails at
// most RetryMax apart, rather than in client-go's backoff of up to a
// minute.
func OpenKube(ctx context.Context, cfg *rest.Config, opts cache.Options, stale kubeinventory.Options, also ...client.Object) (*KubeFleet, error) {
	if opts.NewInformer == nil {
		opts.NewInformer = retrying(retryLog())
	}
	if stale.ServerTime && stale.Clock == nil && opts.HTTPClient == nil {
		// The informers' lists and watches tell the freshness filter
		// the kube-apiserver's time. (A cache given its own HTTP
		// client would not call through cfg's transport.)
		clock := serverclock.New(serverclock.Config{Log: slog.Default().With("component", "inventory")})
		cfg = rest.CopyConfig(cfg)
		cfg.Wrap(clock.Wrap)
		stale.Clock = clock // kubeinventory measures durations on the real clock then
	}
	c, err := cache.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("new informer cache for %s: %w", cfg.Host, err)
	}
	k := &KubeFleet{Cache: c, Source: kubeinventory.New(c, stale), host: cfg.Host}
	for _, obj := range append([]client.Object{&v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{}}, also...) {
		kind := strings.TrimPrefix(fmt.Sprintf("%T", obj), "*")
		if _, err := c.GetInformer(ctx, obj); err != nil {
			if meta.IsNoMatchError(err) {
				return nil, fmt.Errorf("watch %s at %s: the skiff.dev CRDs (api/crds) are not installed: %w", kind, cfg.Host, err)
			}
			return nil, fmt.Errorf("watch %s at %s: %w", kind, cfg.Host, err)
		}
		k.kinds = append(k.kinds, kind)
	}
	// The freshness filter's reference follows every publish (see
	// kubeinventory.Source.Observe), whatever the binary lists; a
	// shard's event moves no stamp.
	invInf, err := c.GetInformer(ctx, &v1beta1.NodeInventory{})
	if err != nil {
		return nil, fmt.Errorf("get the NodeInventory informer: %w", err)
	}
	if _, err := invInf.AddEventHandler(onEvent(func() { _ = k.Source.Observe(context.Background()) })); err != nil {
		return nil, fmt.Errorf("watch NodeInventory events: %w", err)
	}
	// The fleet's joins read only the shards of nodes that had a shard
	// event since (kubeinventory.Source.TrackShardEvents).
	shardInf, err := c.GetInformer(ctx, &v1beta1.NodeInventoryShard{})
	if err != nil {
		return nil, fmt.Errorf("get the NodeInventoryShard informer: %w", err)
	}
	k.Source.TrackShardEvents()
	if _, err := shardInf.AddEventHandler(k.Source.ShardEventHandler(nil)); err != nil {
		return nil, fmt.Errorf("watch NodeInventoryShard events: %w", err)
	}
	return k, nil
}

// onEvent calls f on every event: add, update and delete.
func onEvent(f func()) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f() },
		UpdateFunc: func(any, any) { f() },
		DeleteFunc: func(any) { f() },
	}
}

var cacheLogOnce sync.Once

// SendCacheLogs sends controller-runtime's logs (kube mode's cache) to log.
// The first call wins: controller-runtime keeps one process-wide logger.
func SendCacheLogs(log *slog.Logger) {
	cacheLogOnce.Do(func() { crlog.SetLogger(logr.FromSlogHandler(log.Handler())) })
}

// Host is the kube-apiserver the cache reads.
func (k *KubeFleet) Host() string { return k.host }

// OnInventoryChange calls f on every NodeInventory and NodeInventoryShard
// event: add, update and delete. A shard's event reaches Source before f
// runs, so what f reads of the fleet has the shard (the handlers of one
// informer run in no set order).
func (k *KubeFleet) OnInventoryChange(ctx context.Context, f func()) error {
	for _, obj := range []client.Object{&v1beta1.NodeInventory{}, &v1beta1.NodeInventoryShard{}} {
		inf, err := k.Cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("get the %T informer: %w", obj, err)
		}
		h := onEvent(f)
		if _, shard := obj.(*v1beta1.NodeInventoryShard); shard {
			h = k.Source.ShardEventHandler(f)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watch %T events: %w", obj, err)
		}
	}
	return nil
}

// Start runs the cache until Stop or the end of ctx, and returns once it
// has synced. With a timeout above 0 it gives up after that long, with an
// error that says what to check; on any error the cache is stopped.
func (k *KubeFleet) Start(ctx context.Context, timeout time.Duration) error {
	runCtx, cancel := context.WithCancel(ctx)
	k.cancel = cancel
	k.wg.Go(func() { k.err = k.Cache.Start(runCtx) })
	syncCtx := ctx
	if timeout > 0 {
		var cancelSync context.CancelFunc
		syncCtx, cancelSync = context.WithTimeout(ctx, timeout)
		defer cancelSync()
	}
	if k.Cache.WaitForCacheSync(syncCtx) {
		return nil
	}
	err := k.Stop()
	switch {
	case err != nil:
		return fmt.Errorf("run the informer cache: %w", err)
	case ctx.Err() != nil:
		return fmt.Errorf("wait for the informer cache: %w", ctx.Err())
	case timeout > 0:
		return fmt.Errorf("the informer cache did not sync within %s: check that %s is reachable and that this server may list and watch %s",
			timeout, k.host, strings.Join(k.kinds, ", "))
	}
	return errors.New("sync the informer cache: the cache stopped")
}

// Stop ends the cache, waits for it, and returns the error it stopped with.
func (k *KubeFleet) Stop() error {
	if k.cancel != nil {
		k.cancel()
	}
	k.wg.Wait()
	return k.err
}
