package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/apiserver/internal/metrics"
	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/tracing"
	"github.com/skiff-dev/skiff/wire"
)

func serveCommand() *cobra.Command {
	o := newServeOptions()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the e2b REST API over the fleet",
		Long: `Serve the e2b REST API that unmodified e2b SDKs call (E2B_API_URL).

With --inventory static (single-host mode) it needs no Kubernetes: it
follows each --sandboxd over its Watch stream, a host whose stream is down
leaves the fleet until it is back, and API keys come from --api-keys-file.

With --inventory kube it reads, through one informer cache, the
NodeInventory objects the hosts publish (a host whose publishedAt falls
behind by more than --inventory-stale-after leaves the fleet), the
SandboxTemplates (the templates SDKs may start), and the Secrets labelled
skiff.dev/api-key (the API keys; a key's team is its Secret's namespace).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), o) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func serve(ctx context.Context, o *serveOptions) error {
	if err := o.Complete(); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	log, err := daemon.Logger(&o.log)
	if err != nil {
		return err
	}
	kubeclient.SendLogs(log)
	fleetsource.SendCacheLogs(log)
	stopTracing, err := daemon.Tracing(ctx, log, "sandbox-apiserver")
	if err != nil {
		return err
	}
	defer stopTracing()
	var adminLn net.Listener
	if o.admin.Listen != "" {
		l, err := net.Listen("tcp", o.admin.Listen)
		if err != nil {
			return fmt.Errorf("listen on --admin-listen %s: %w", o.admin.Listen, err)
		}
		adminLn = l
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		if adminLn != nil {
			_ = adminLn.Close()
		}
		return fmt.Errorf("listen on --listen %s: %w", o.listen, err)
	}
	return serveOn(ctx, o, ln, adminLn, log)
}

// errNotSynced is /readyz's answer until the fleet source has synced.
var errNotSynced = errors.New("the fleet inventory has not synced yet")

// serveOn serves the e2b API on ln and, unless adminLn is nil, the operations
// endpoints on adminLn, until ctx ends; it closes both. The admin listener
// serves from the start, so /healthz answers and /readyz says 503 while
// newApp waits for the fleet. o must be valid.
func serveOn(ctx context.Context, o *serveOptions, ln, adminLn net.Listener, log *slog.Logger) error {
	m := metrics.New()
	var current atomic.Pointer[app]
	group := daemon.NewGroup(log, o.shutdown.Timeout)
	if adminLn != nil {
		group.ServeAdmin(daemon.AdminConfig{
			Gatherer: m.Registry,
			Ready: func() error {
				if a := current.Load(); a == nil || !a.ready() {
					return errNotSynced
				}
				return nil
			},
			Pprof: o.admin.EnablePprof,
		}, adminLn)
		log.InfoContext(ctx, "serving the operations endpoints", "admin_listen", adminLn.Addr().String(), "pprof", o.admin.EnablePprof)
	}

	a, err := newApp(ctx, o, log, m)
	if err != nil {
		_ = ln.Close()
		group.Close()
		return err
	}
	defer a.stop()
	current.Store(a)

	// ReadTimeout bounds each request's headers and body from its first
	// byte; once the body is read, the server clears it, so a long create
	// or a keep-alive connection is not cut (IdleTimeout is for those).
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: min(readHeaderTimeout, o.readTimeout), ReadTimeout: o.readTimeout, IdleTimeout: 620 * time.Second}
	group.Serve("the e2b API", srv, ln)
	log.InfoContext(ctx, "serving the e2b API", append([]any{"listen", ln.Addr().String()}, a.describe...)...)
	if a.kubeAPI != nil {
		group.Run("the aggregated API", a.kubeAPI.server.Run)
		ss := o.kubeAPI.Recommended.SecureServing
		log.InfoContext(ctx, "serving the aggregated API", "group_version", sbv1.GroupVersion.String(), "bind_address", ss.BindAddress.String(), "secure_port", ss.BindPort)
	}
	return group.Wait(ctx)
}

// app is a wired sandbox-apiserver: the e2b API's handler and the
// background parts it owns. serve runs it; tests build the same thing.
type app struct {
	handler http.Handler
	// describe is what serve logs about the fleet's origin.
	describe []any
	// kube holds the Kubernetes parts, nil with --inventory static.
	kube *kubeParts
	// kubeAPI is the aggregated API; nil with --inventory static or
	// --secure-port 0.
	kubeAPI *kubeAPI
	// ready reports whether the fleet source has synced (/readyz).
	ready func() bool
	// stop ends the background parts and waits for them.
	stop func()
}

// newApp builds everything serve serves from validated options: the fleet
// source, key store and template catalog of the inventory mode, then the
// backend, the e2b API and authentication over them, counted into m (nil:
// metrics of its own). With --inventory kube it returns once the informer
// caches have synced. The background parts run until a.stop or the end of
// ctx.
func newApp(ctx context.Context, o *serveOptions, log *slog.Logger, m *metrics.Metrics) (*app, error) {
	if m == nil {
		m = metrics.New()
	}
	tokens, err := o.nodeTokens.Load()
	if err != nil {
		return nil, err
	}
	clients := newClients(tokens)
	a := &app{}
	var (
		src     inventory.Source
		keys    auth.Store
		catalog fleet.Catalog // nil: the fresh nodes' templates
	)
	if o.fleet.IsKube() {
		k, err := startKube(ctx, o, log)
		if err != nil {
			return nil, err
		}
		a.kube, a.stop = k, k.stop
		a.ready = func() bool { return true } // startKube waited for the caches
		src, keys, catalog = k.source, k.keys, k.templates
		m.APIKeys(k.countKeys)
		m.WarmPoolLeader(k.leader.Leading)
		m.FleetReference(k.source.Reference)
		a.describe = []any{"inventory", fleetsource.Kube, "kube-apiserver", k.host, "node_tokens_per_host", tokens.PerNode()}
	} else {
		fs, err := auth.NewFileStore(o.keysFile, auth.FileStoreOptions{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("read --api-keys-file: %w", err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		a.stop = func() { cancel(); wg.Wait(); _ = fs.Close() }
		// A fleet-wide token (Validate): the hosts are called before their
		// names are known.
		hosts := fleetsource.Follow(runCtx, &wg, o.fleet.Sandboxd, func(endpoint string) sandboxdv1connect.SandboxdServiceClient {
			return clients("", endpoint)
		})
		src, keys = hosts.Source, fs
		a.ready = fleetsource.Gate(func() bool { return hosts.Tried(hosts.InSource(runCtx)) }, func() {
			log.Info("fleet inventory synced", "hosts", hosts.Len())
		})
		a.describe = []any{"inventory", fleetsource.Static, "hosts", o.fleet.Sandboxd}
	}

	backend := fleet.New(fleet.Config{
		Source:  src,
		Placer:  placement.New(src, o.placement),
		Clients: clients,
		Tokens:  tokens.For,
		Catalog: catalog,
		Logger:  log,
		Metrics: m,

		BodyIdleTimeout: o.readTimeout,
		MaxLifetime:     o.maxTimeout,
	})
	stopPools, err := startWarmPools(ctx, o, a.kube, src, backend, log)
	if err != nil {
		a.stop()
		return nil, err
	}
	stopRest := a.stop
	a.stop = func() { stopPools(); stopRest() }
	if a.kube != nil && o.kubeAPI.Enabled() {
		k, err := newKubeAPI(ctx, o, a.kube, backend, log)
		if err != nil {
			a.stop()
			return nil, err
		}
		a.kubeAPI = k
		stopKube := a.stop
		a.stop = func() { k.stop(); stopKube() }
	}
	limiter := auth.NewRateLimiter(o.createRate, o.createBurst)
	api := e2bapi.New(e2bapi.Config{
		Backend:       limitTeams(backend, o.maxPerTeam, limiter),
		Team:          func(r *http.Request) (string, bool) { return auth.TeamFrom(r.Context()) },
		SandboxDomain: o.sandboxDomain,
		MaxTimeout:    o.maxTimeout,
		Logger:        log,
		VolumeKey:     tokens.VolumeKey(),
	})
	route := routeOf(api)
	a.handler = tracing.Handler(m.Instrument(withHealth(api, auth.Middleware(keys, limitCreates(limiter, api))), route),
		spanName(route), notHealth)
	return a, nil
}

// spanName names a request's span by its route ("POST /v2/sandboxes"),
// never by its path, which holds sandbox IDs.
func spanName(route func(*http.Request) string) func(*http.Request) string {
	return func(r *http.Request) string {
		if p := route(r); p != "" {
			return p
		}
		return "unmatched route"
	}
}

// notHealth keeps GET /health, which load balancers and probes call every
// few seconds, out of the traces.
func notHealth(r *http.Request) bool { return r.URL.Path != "/health" }

// withHealth sends GET and HEAD /health to api unauthenticated, as e2b's
// API serves it, and everything else to authed. It is not a ServeMux: a
// mux redirects a path that is not canonical ("//v2/sandboxes",
// "/a/../health") before any handler sees it, and the e2b API answers such
// a path 404 in e2b's shape (docs/e2b-compat.md).
func withHealth(api, authed http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			api.ServeHTTP(w, r)
			return
		}
		// e2b's volume content routes take the volume's token, which the
		// API checks, not an API key.
		if strings.HasPrefix(r.URL.Path, "/volumecontent/") {
			api.ServeHTTP(w, r)
			return
		}
		authed.ServeHTTP(w, r)
	})
}

// routeOf returns the function that names the e2b API's route a request
// matches (e2bapi's RoutePattern), the route label of the request metrics.
func routeOf(api http.Handler) func(*http.Request) string {
	if rp, ok := api.(interface{ RoutePattern(*http.Request) string }); ok {
		return rp.RoutePattern
	}
	return func(*http.Request) string { return "" }
}

// limitCreates answers 429 in e2b's shape when a team creates faster than
// its rate. A fork takes its count from the same rate in teamLimit, once
// its body has been read.
func limitCreates(l *auth.RateLimiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes") {
			if team, _ := auth.TeamFrom(r.Context()); !l.Allow(team) {
				wire.WriteError(w, http.StatusTooManyRequests, createRateExhausted)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
