package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// newClients returns the sandboxd client of each node and endpoint, which
// sends the node's token.
func newClients(tokens *nodetoken.Tokens) func(node, endpoint string) sandboxdv1connect.SandboxdServiceClient {
	return sandboxdapi.NewNodeClients(tokens.For, &http.Client{})
}

// newScheme knows client-go's types and skiff.dev/v1beta1.
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("register client-go types: %w", err)
	}
	if err := v1beta1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("register skiff.dev/v1beta1: %w", err)
	}
	return s, nil
}

// kubeParts are serve's Kubernetes half: one informer cache holding the
// NodeInventories, the SandboxTemplates and the API-key Secrets (only
// those: see auth.ConfigureCache), and the fleet source, key store and
// template catalog that read through it.
type kubeParts struct {
	cache     cache.Cache
	source    *kubeinventory.Source
	keys      *auth.SecretStore
	templates *fleet.SandboxTemplates
	// host is the kube-apiserver's URL, for the log.
	host string
	// stop stops the cache and waits for it.
	stop func()
}

// countKeys is the number of API-key Secrets in the cache (the cache holds
// no other Secret), for the api_keys gauge. It deep-copies no object.
func (k *kubeParts) countKeys() int {
	var l corev1.SecretList
	if err := k.cache.List(context.Background(), &l, client.UnsafeDisableDeepCopy); err != nil {
		return 0
	}
	return len(l.Items)
}

// watched are the objects the cache holds.
func watched() []client.Object {
	return []client.Object{&v1beta1.NodeInventory{}, &v1beta1.SandboxTemplate{}, &corev1.Secret{}}
}

// startKube builds and starts the cache and waits, at most
// --cache-sync-timeout, until it has listed everything it watches.
func startKube(ctx context.Context, o *serveOptions, log *slog.Logger) (*kubeParts, error) {
	cfg, err := kubeclient.RESTConfig(o.fleet.Kubeconfig, "sandbox-apiserver")
	if err != nil {
		return nil, err
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	opts := cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()}
	auth.ConfigureCache(&opts) // API-key Secrets only, trimmed to their digest
	c, err := cache.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("new informer cache for %s: %w", cfg.Host, err)
	}
	// The informers first, so that a missing CRD is named as such; the
	// indexes join them before the cache starts.
	for _, obj := range watched() {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			if meta.IsNoMatchError(err) {
				return nil, fmt.Errorf("watch %T at %s: the skiff.dev CRDs (api/crds) are not installed: %w", obj, cfg.Host, err)
			}
			return nil, fmt.Errorf("watch %T at %s: %w", obj, cfg.Host, err)
		}
	}
	keys, err := auth.NewSecretStore(ctx, c)
	if err != nil {
		return nil, err
	}
	templates, err := fleet.NewSandboxTemplates(ctx, c, log)
	if err != nil {
		return nil, err
	}

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Start(runCtx); err != nil {
			log.Error("informer cache stopped", "error", err)
		}
	})
	stop := func() { cancel(); wg.Wait() }

	syncCtx, cancelSync := context.WithTimeout(ctx, o.cacheSyncTimeout)
	defer cancelSync()
	if !c.WaitForCacheSync(syncCtx) {
		stop()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("wait for the informer caches: %w", err)
		}
		return nil, fmt.Errorf("informer caches did not sync within %s (--cache-sync-timeout): check that %s is reachable and that this server may list and watch nodeinventories and sandboxtemplates (skiff.dev) and secrets", o.cacheSyncTimeout, cfg.Host)
	}
	return &kubeParts{
		cache:     c,
		source:    kubeinventory.New(c, o.fleet.Stale),
		keys:      keys,
		templates: templates,
		host:      cfg.Host,
		stop:      stop,
	}, nil
}
