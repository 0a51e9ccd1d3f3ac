package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/apiserver/internal/warmpool"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/fleetsource"
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
	fleet  *fleetsource.KubeFleet
	config *rest.Config
	scheme *runtime.Scheme
	// leader says whether this replica drives the warm pools now.
	leader    *warmpool.Leader
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
	// The informers first, so that a missing CRD is named as such; the
	// indexes join them before the cache starts.
	kf, err := fleetsource.OpenKube(ctx, cfg, opts, o.fleet.Stale, &v1beta1.SandboxTemplate{}, &v1beta1.SandboxWarmPool{}, &corev1.Secret{})
	if err != nil {
		return nil, err
	}
	keys, err := auth.NewSecretStore(ctx, kf.Cache)
	if err != nil {
		return nil, err
	}
	templates, err := fleet.NewSandboxTemplates(ctx, kf.Cache, log)
	if err != nil {
		return nil, err
	}
	if err := kf.Start(ctx, o.cacheSyncTimeout); err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w (--cache-sync-timeout)", err)
	}
	stop := func() {
		if err := kf.Stop(); err != nil {
			log.Error("informer cache stopped", "error", err)
		}
	}
	return &kubeParts{
		fleet:     kf,
		config:    cfg,
		scheme:    scheme,
		leader:    &warmpool.Leader{},
		cache:     kf.Cache,
		source:    kf.Source,
		keys:      keys,
		templates: templates,
		host:      kf.Host(),
		stop:      stop,
	}, nil
}
