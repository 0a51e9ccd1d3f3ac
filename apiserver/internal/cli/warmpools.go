package cli

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/apiserver/internal/warmpool"
	"github.com/skiff-dev/skiff/shared/inventory"
)

// startWarmPools starts the warm-pool driver: over the --warm-pool pools
// with --inventory static (none: no driver), over the SandboxWarmPool
// objects under the Lease with --inventory kube. It returns the function
// that stops it and waits.
func startWarmPools(ctx context.Context, o *serveOptions, k *kubeParts, src inventory.Source, backend *fleet.Backend, log *slog.Logger) (func(), error) {
	cfg := warmpool.Config{Source: src, Fleet: backend, Interval: o.warmPoolInterval, Logger: log}
	if k == nil {
		pools, err := warmpool.ParseStatic(o.warmPools)
		if err != nil {
			return nil, err
		}
		if len(pools) == 0 {
			return func() {}, nil
		}
		cfg.Pools = pools
		return runUntilStop(ctx, warmpool.New(cfg).Run), nil
	}
	direct, err := client.New(k.config, client.Options{Scheme: k.scheme})
	if err != nil {
		return nil, fmt.Errorf("client for warm-pool status: %w", err)
	}
	cfg.Pools, cfg.Status = warmpool.KubePools{Reader: k.cache}, warmpool.KubeStatus{Client: direct}
	d := warmpool.New(cfg)
	if err := k.fleet.OnInventoryChange(ctx, d.Notify); err != nil {
		return nil, err
	}
	inf, err := k.cache.GetInformer(ctx, &v1beta1.SandboxWarmPool{})
	if err != nil {
		return nil, fmt.Errorf("get the SandboxWarmPool informer: %w", err)
	}
	notify := func(any) { d.Notify() }
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(any, any) { d.Notify() }, DeleteFunc: notify}); err != nil {
		return nil, fmt.Errorf("watch SandboxWarmPool events: %w", err)
	}
	if !o.lease.Enabled {
		log.InfoContext(ctx, "driving the warm pools without a lease (--leader-elect=false): run one replica only")
		k.leader.Unleased()
		return runUntilStop(ctx, d.Run), nil
	}
	cs, err := kubernetes.NewForConfig(k.config)
	if err != nil {
		return nil, fmt.Errorf("client for the warm-pool lease: %w", err)
	}
	identity := warmpool.Identity()
	return runUntilStop(ctx, func(ctx context.Context) {
		if err := warmpool.Campaign(ctx, cs, o.lease, identity, log, k.leader, d.Run); err != nil {
			log.ErrorContext(ctx, "campaign for the warm-pool lease", "error", err)
		}
	}), nil
}

// runUntilStop runs f until the returned stop, which waits for it.
func runUntilStop(ctx context.Context, f func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { f(ctx) })
	return func() { cancel(); wg.Wait() }
}
