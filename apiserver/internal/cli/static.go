package cli

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// followedHost is one --sandboxd of static mode.
type followedHost struct {
	endpoint string
	mirror   *hostinventory.Host
}

// followHosts is the fleet of single-host mode: each sandboxd at
// endpoints, followed over its Watch stream until ctx ends, in goroutines
// that wg waits for.
func followHosts(ctx context.Context, wg *sync.WaitGroup, endpoints []string,
	clients func(string) sandboxdv1connect.SandboxdServiceClient) (*inventory.StaticSource, []followedHost) {
	src := inventory.NewStaticSource()
	hosts := make([]followedHost, 0, len(endpoints))
	for _, addr := range endpoints {
		h := hostinventory.New(clients(addr), addr, hostinventory.Options{})
		hosts = append(hosts, followedHost{endpoint: addr, mirror: h})
		wg.Go(func() { _ = h.Run(ctx) })
		wg.Go(func() { hostinventory.Feed(ctx, h, src, time.Now) })
	}
	return src, hosts
}

// hostsTried reports whether each host has been followed once — reached
// and in src — or has failed once. A host that is down must not keep the
// others from serving (as in envd-proxy's static mode).
func hostsTried(ctx context.Context, hosts []followedHost, src *inventory.StaticSource) bool {
	nodes, err := src.ListNodes(ctx)
	if err != nil {
		return false
	}
	inSource := make(map[string]bool, len(nodes))
	for i := range nodes {
		inSource[nodes[i].Spec.Endpoint] = true
	}
	for _, h := range hosts {
		synced, err := h.mirror.Synced()
		switch {
		case synced && inSource[h.endpoint]:
		case !synced && err != nil:
		default:
			return false
		}
	}
	return true
}

// once returns a readiness check that holds from the first time cond does:
// readiness is a startup gate, not a health signal (a host that goes away
// later leaves the fleet, not the server). onReady runs that first time.
func once(cond func() bool, onReady func()) func() bool {
	var done atomic.Bool
	return func() bool {
		if done.Load() {
			return true
		}
		if !cond() {
			return false
		}
		if done.CompareAndSwap(false, true) {
			onReady()
		}
		return true
	}
}
