// Package fleetsource is where a reader of the fleet (sandbox-apiserver,
// sandbox-envd-proxy) finds it: the --inventory, --sandboxd, --kubeconfig
// and freshness flags, the hosts of static mode followed over their Watch
// streams (Follow), kube mode's informer cache and the fleet read from it
// through kubeinventory's freshness filter (OpenKube), and the readiness
// gate both readers hold until they have looked at the fleet once (Gate,
// KubeFleet.Start).
//
// Each binary configures kube mode's cache itself (OpenKube's options): the
// apiserver also watches SandboxTemplates and API-key Secrets through it,
// the proxy trims each inventory to what routing reads.
package fleetsource

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// Where the fleet comes from (--inventory).
const (
	// Static follows the --sandboxd hosts itself; no Kubernetes.
	Static = "static"
	// Kube reads the NodeInventory objects the hosts publish.
	Kube = "kube"
)

// Options are the flags that say where the fleet is.
type Options struct {
	// Inventory is Static or Kube.
	Inventory string
	// Sandboxd are the hosts of static mode (host:port).
	Sandboxd []string
	// Kubeconfig, in kube mode; empty: kubeclient.RESTConfig's search.
	Kubeconfig string
	// Stale is kube mode's freshness filter.
	Stale kubeinventory.Options
}

// NewOptions returns the defaults: static mode.
func NewOptions() Options {
	return Options{Inventory: Static, Stale: kubeinventory.NewOptions()}
}

// AddFlags registers --inventory, --sandboxd, --kubeconfig and
// --inventory-stale-after, defaulting to o's values.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Inventory, "inventory", o.Inventory, "Where the fleet comes from: static (the --sandboxd hosts, followed over their Watch streams; no Kubernetes) "+
		"or kube (the NodeInventory objects the hosts publish, less the stale ones: see --inventory-stale-after).")
	fs.StringSliceVar(&o.Sandboxd, "sandboxd", o.Sandboxd, "With --inventory static only (refused with kube), and at least one there: a sandboxd's host:port (repeat, or comma-separate, for several). "+
		"A host whose Watch stream is down leaves the fleet until it is back.")
	kubeclient.AddKubeconfigFlag(fs, &o.Kubeconfig, "With --inventory kube only (refused with static)")
	o.Stale.AddFlags(fs)
}

// IsKube reports whether the fleet is read from Kubernetes.
func (o *Options) IsKube() bool { return o.Inventory == Kube }

// Validate reports every option that cannot work, naming its flag.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch o.Inventory {
	case Static:
		if len(o.Sandboxd) == 0 {
			add("--inventory static needs at least one --sandboxd host:port")
		}
		for _, h := range o.Sandboxd {
			if host, port, err := net.SplitHostPort(h); err != nil || host == "" || port == "" {
				add("--sandboxd %q: want host:port", h)
			}
		}
		if o.Kubeconfig != "" {
			add("--kubeconfig is only read with --inventory kube")
		}
	case Kube:
		if len(o.Sandboxd) > 0 {
			add("--sandboxd is only read with --inventory static: with --inventory kube the hosts come from their NodeInventory objects")
		}
		if err := o.Stale.Validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		add("--inventory %q: must be %s or %s", o.Inventory, Static, Kube)
	}
	return errors.Join(errs...)
}

// Hosts are the sandboxd hosts of static mode, each followed over its Watch
// stream and mirrored into Source.
type Hosts struct {
	// Source is the fleet: each host that is reached, while its stream is
	// up.
	Source *inventory.StaticSource
	hosts  []followed
}

type followed struct {
	endpoint string
	mirror   *hostinventory.Host
}

// Follow follows each sandboxd at endpoints (through the client clients
// returns for it) until ctx ends, in goroutines that wg waits for.
func Follow(ctx context.Context, wg *sync.WaitGroup, endpoints []string,
	clients func(endpoint string) sandboxdv1connect.SandboxdServiceClient) *Hosts {
	h := &Hosts{Source: inventory.NewStaticSource(), hosts: make([]followed, 0, len(endpoints))}
	for _, addr := range endpoints {
		m := hostinventory.New(clients(addr), addr, hostinventory.Options{})
		h.hosts = append(h.hosts, followed{endpoint: addr, mirror: m})
		wg.Go(func() { _ = m.Run(ctx) })
		wg.Go(func() { hostinventory.Feed(ctx, m, h.Source, time.Now) })
	}
	return h
}

// Len is how many hosts are followed.
func (h *Hosts) Len() int { return len(h.hosts) }

// Tried reports whether each host has been followed once — reached and
// seen by the reader (seen: its endpoint is in what the reader routes by)
// — or has failed once. A host that is down must not keep the others from
// serving.
func (h *Hosts) Tried(seen func(endpoint string) bool) bool {
	for _, f := range h.hosts {
		synced, err := f.mirror.Synced()
		switch {
		case synced && seen(f.endpoint):
		case !synced && err != nil:
		default:
			return false
		}
	}
	return true
}

// InSource reports whether endpoint is a node of Source now: the seen of
// a reader that reads Source directly.
func (h *Hosts) InSource(ctx context.Context) func(endpoint string) bool {
	return func(endpoint string) bool {
		nodes, err := h.Source.ListNodesShared(ctx)
		if err != nil {
			return false
		}
		for i := range nodes {
			if nodes[i].Spec.Endpoint == endpoint {
				return true
			}
		}
		return false
	}
}

// Gate returns a readiness check that holds from the first time cond does:
// readiness is a startup gate, not a health signal (a host that goes away
// later leaves the fleet, not the server). onReady runs that first time.
func Gate(cond func() bool, onReady func()) func() bool {
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
