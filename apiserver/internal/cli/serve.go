package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/apiserver/internal/metrics"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/logflags"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/placement"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// Where serve's fleet comes from (--inventory).
const (
	// inventoryStatic follows the --sandboxd hosts itself; no Kubernetes.
	inventoryStatic = "static"
	// inventoryKube reads NodeInventory objects, SandboxTemplates and
	// API-key Secrets from Kubernetes.
	inventoryKube = "kube"
)

// DefaultAdminListen is where serve answers /metrics, /healthz and
// /readyz unless --admin-listen says otherwise: loopback, so that nothing
// but the host sees them until an operator opens them up.
const DefaultAdminListen = "127.0.0.1:9090"

// DefaultReadTimeout bounds how long a request to the e2b API may take to
// arrive, headers and body: its bodies are JSON of a few KB (at most 1
// MiB), so a client that sends them slower is holding a connection, not
// using the API.
const DefaultReadTimeout = 20 * time.Second

// readHeaderTimeout bounds the headers alone.
const readHeaderTimeout = 10 * time.Second

// DefaultCacheSyncTimeout bounds how long serve --inventory kube waits for
// its informer caches before giving up.
const DefaultCacheSyncTimeout = 2 * time.Minute

// Per-team limits unless a flag says otherwise: e2b's defaults for a Pro
// team (100 concurrent sandboxes, 5 creates a second), so that one team's
// runaway loop cannot take a whole fleet. Skiff counts paused sandboxes
// too: on a Skiff host they still hold their disk and memory.
const (
	DefaultCreateRatePerTeam   = 5
	DefaultCreateBurstPerTeam  = 20
	DefaultMaxSandboxesPerTeam = 100
)

// serveOptions are the flags of `serve`.
type serveOptions struct {
	listen           string
	readTimeout      time.Duration
	adminListen      string
	enablePprof      bool
	inventory        string
	sandboxd         []string
	kubeconfig       string
	cacheSyncTimeout time.Duration
	nodeTokens       nodetoken.Options
	keysFile         string
	sandboxDomain    string
	maxTimeout       time.Duration
	createRate       float64
	createBurst      int
	maxPerTeam       int
	placement        placement.Options
	staleness        kubeinventory.Options
	log              logflags.Options
}

// newServeOptions returns the defaults.
func newServeOptions() *serveOptions {
	return &serveOptions{
		listen:           ":8080",
		readTimeout:      DefaultReadTimeout,
		adminListen:      DefaultAdminListen,
		inventory:        inventoryStatic,
		cacheSyncTimeout: DefaultCacheSyncTimeout,
		maxTimeout:       e2bapi.DefaultMaxTimeout,
		createRate:       DefaultCreateRatePerTeam,
		createBurst:      DefaultCreateBurstPerTeam,
		maxPerTeam:       DefaultMaxSandboxesPerTeam,
		placement:        placement.NewOptions(),
		staleness:        kubeinventory.NewOptions(),
		log:              logflags.New(logflags.Text),
	}
}

// addFlags registers serve's flags, each defaulting to o's current value.
func (o *serveOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", o.listen, "Address of the e2b API.")
	f.DurationVar(&o.readTimeout, "read-timeout", o.readTimeout, "How long a request to the e2b API may take to arrive, headers and body; a body not in by then answers 408 and its connection is closed.")
	f.StringVar(&o.adminListen, "admin-listen", o.adminListen, "Address of the operations endpoints: /metrics (Prometheus), /healthz, /readyz, and /debug/pprof/ with --enable-pprof; empty turns them off.")
	f.BoolVar(&o.enablePprof, "enable-pprof", o.enablePprof, "Serve Go's profiles (net/http/pprof) under /debug/pprof/ on --admin-listen; never on --listen.")
	f.StringVar(&o.inventory, "inventory", o.inventory, "Where the fleet comes from: static (the --sandboxd hosts, no Kubernetes) or kube (NodeInventory objects, SandboxTemplates and API-key Secrets from Kubernetes).")
	f.StringSliceVar(&o.sandboxd, "sandboxd", o.sandboxd, "With --inventory static: a sandboxd's host:port (repeat or comma-separate for several).")
	f.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "With --inventory kube: the kubeconfig file; empty: $KUBECONFIG, else the pod's service account, else ~/.kube/config.")
	f.DurationVar(&o.cacheSyncTimeout, "cache-sync-timeout", o.cacheSyncTimeout, "With --inventory kube: how long to wait for the first list of NodeInventories, SandboxTemplates and API-key Secrets before giving up.")
	f.StringVar(&o.keysFile, "api-keys-file", o.keysFile, "With --inventory static: file of API keys, one \"team key\" per line, reloaded on change (sandbox-apiserver keys create adds one). With --inventory kube keys are Secrets instead.")
	f.StringVar(&o.sandboxDomain, "sandbox-domain", o.sandboxDomain, "Domain returned to SDKs, which then reach envd at 49983-<id>.<domain>; empty: the SDK's own.")
	f.DurationVar(&o.maxTimeout, "max-timeout", o.maxTimeout, "Longest lifetime a sandbox may be given.")
	f.Float64Var(&o.createRate, "create-rate-per-team", o.createRate, "Creates per second one team may make on average (0: no limit); beyond, 429.")
	f.IntVar(&o.createBurst, "create-burst-per-team", o.createBurst, "Creates one team may make at once above its rate.")
	f.IntVar(&o.maxPerTeam, "max-sandboxes-per-team", o.maxPerTeam, "Most sandboxes (running and paused) one team may have (0: no limit); beyond, creates get 429.")
	o.nodeTokens.AddFlags(f)
	o.placement.AddFlags(f)
	o.staleness.AddFlags(f)
	o.log.AddFlags(f)
}

// Validate reports every option that cannot work, naming its flag.
func (o *serveOptions) Validate() error {
	var errs []error
	if o.listen == "" {
		errs = append(errs, errors.New("--listen is required"))
	} else if _, _, err := net.SplitHostPort(o.listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: want host:port: %w", o.listen, err))
	}
	if o.readTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--read-timeout must be greater than 0, got %s", o.readTimeout))
	}
	errs = append(errs, o.validateAdmin()...)
	if err := o.log.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch o.inventory {
	case inventoryStatic:
		if len(o.sandboxd) == 0 {
			errs = append(errs, errors.New("--inventory static needs at least one --sandboxd"))
		}
		if o.keysFile == "" {
			errs = append(errs, errors.New("--inventory static needs --api-keys-file"))
		}
		if o.kubeconfig != "" {
			errs = append(errs, errors.New("--kubeconfig is only read with --inventory kube"))
		}
	case inventoryKube:
		if len(o.sandboxd) > 0 {
			errs = append(errs, errors.New("--sandboxd is only read with --inventory static: with --inventory kube the hosts come from their NodeInventory objects"))
		}
		if o.keysFile != "" {
			errs = append(errs, errors.New("--api-keys-file is only read with --inventory static: with --inventory kube, API keys are Secrets labelled skiff.dev/api-key in the team's namespace (sandbox-apiserver keys create --team T makes one)"))
		}
		if o.cacheSyncTimeout <= 0 {
			errs = append(errs, fmt.Errorf("--cache-sync-timeout must be greater than 0, got %s", o.cacheSyncTimeout))
		}
		if err := o.staleness.Validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("--inventory %q: must be %s or %s", o.inventory, inventoryStatic, inventoryKube))
	}
	if err := o.nodeTokens.Validate(o.inventory == inventoryKube); err != nil {
		errs = append(errs, err)
	}
	if o.maxTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--max-timeout must be greater than 0, got %s", o.maxTimeout))
	}
	if o.createRate < 0 {
		errs = append(errs, fmt.Errorf("--create-rate-per-team must not be negative, got %g", o.createRate))
	}
	if o.createRate > 0 && o.createBurst < 1 {
		errs = append(errs, fmt.Errorf("--create-burst-per-team must be at least 1 with a --create-rate-per-team, got %d", o.createBurst))
	}
	if o.maxPerTeam < 0 {
		errs = append(errs, fmt.Errorf("--max-sandboxes-per-team must not be negative, got %d", o.maxPerTeam))
	}
	if err := o.placement.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

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
	o.addFlags(cmd.Flags())
	return cmd
}

func serve(ctx context.Context, o *serveOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	log, err := o.log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	setKubeLogger(log)
	var adminLn net.Listener
	if o.adminListen != "" {
		l, err := net.Listen("tcp", o.adminListen)
		if err != nil {
			return fmt.Errorf("listen on --admin-listen %s: %w", o.adminListen, err)
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

// serveOn serves the e2b API on ln and, unless adminLn is nil, the operations
// endpoints on adminLn, until ctx ends; it closes both. The admin listener
// serves from the start, so /healthz answers and /readyz says 503 while
// newApp waits for the fleet. o must be valid.
func serveOn(ctx context.Context, o *serveOptions, ln, adminLn net.Listener, log *slog.Logger) error {
	m := metrics.New()
	var (
		current  atomic.Pointer[app]
		draining atomic.Bool
	)
	ready := func() bool {
		a := current.Load()
		return a != nil && !draining.Load() && a.ready()
	}
	admin := startAdmin(ctx, adminLn, adminHandler(m.Registry, ready, o.enablePprof), o.enablePprof, log)
	defer admin.stop(ctx)

	a, err := newApp(ctx, o, log, m)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer a.stop()
	current.Store(a)

	// ReadTimeout bounds each request's headers and body from its first
	// byte; once the body is read, the server clears it, so a long create
	// or a keep-alive connection is not cut (IdleTimeout is for those).
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: min(readHeaderTimeout, o.readTimeout), ReadTimeout: o.readTimeout, IdleTimeout: 620 * time.Second}
	log.Info("serving the e2b API", append([]any{"listen", ln.Addr().String()}, a.describe...)...)
	var serveErr error
	served := make(chan struct{})
	go func() {
		defer close(served)
		serveErr = srv.Serve(ln)
	}()
	select {
	case <-served:
		return fmt.Errorf("serve the e2b API: %w", serveErr)
	case <-admin.done:
		_ = srv.Close()
		<-served
		return fmt.Errorf("serve the operations endpoints on --admin-listen: %w", admin.err)
	case <-ctx.Done():
	}
	draining.Store(true)
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	<-served // Serve returns ErrServerClosed once Shutdown closed the listener
	return err
}

// app is a wired sandbox-apiserver: the e2b API's handler and the
// background parts it owns. serve runs it; tests build the same thing.
type app struct {
	handler http.Handler
	// describe is what serve logs about the fleet's origin.
	describe []any
	// kube holds the Kubernetes parts, nil with --inventory static.
	kube *kubeParts
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
	switch o.inventory {
	case inventoryStatic:
		fs, err := auth.NewFileStore(o.keysFile, auth.FileStoreOptions{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("read --api-keys-file: %w", err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		a.stop = func() { cancel(); wg.Wait(); _ = fs.Close() }
		// A fleet-wide token (Validate): the hosts are called before their
		// names are known.
		static, hosts := followHosts(runCtx, &wg, o.sandboxd, func(endpoint string) sandboxdv1connect.SandboxdServiceClient {
			return clients("", endpoint)
		})
		src, keys = static, fs
		a.ready = once(func() bool { return hostsTried(runCtx, hosts, static) }, func() {
			log.Info("fleet inventory synced", "hosts", len(hosts))
		})
		a.describe = []any{"inventory", inventoryStatic, "hosts", o.sandboxd}
	case inventoryKube:
		k, err := startKube(ctx, o, log)
		if err != nil {
			return nil, err
		}
		a.kube, a.stop = k, k.stop
		a.ready = func() bool { return true } // startKube waited for the caches
		src, keys, catalog = k.source, k.keys, k.templates
		m.APIKeys(k.countKeys)
		a.describe = []any{"inventory", inventoryKube, "kube-apiserver", k.host, "node_tokens_per_host", tokens.PerNode()}
	default:
		return nil, fmt.Errorf("--inventory %q: must be %s or %s", o.inventory, inventoryStatic, inventoryKube)
	}

	backend := fleet.New(fleet.Config{
		Source:  src,
		Placer:  placement.New(src, o.placement),
		Clients: clients,
		Catalog: catalog,
		Logger:  log,
		Metrics: m,
	})
	api := e2bapi.New(e2bapi.Config{
		Backend:       limitTeams(backend, o.maxPerTeam),
		Team:          func(r *http.Request) (string, bool) { return auth.TeamFrom(r.Context()) },
		SandboxDomain: o.sandboxDomain,
		MaxTimeout:    o.maxTimeout,
		Logger:        log,
	})
	limiter := auth.NewRateLimiter(o.createRate, o.createBurst)
	a.handler = m.Instrument(withHealth(api, auth.Middleware(keys, limitCreates(limiter, api))), routeOf(api))
	return a, nil
}

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
// its rate.
func limitCreates(l *auth.RateLimiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes") {
			if team, _ := auth.TeamFrom(r.Context()); !l.Allow(team) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = fmt.Fprintf(w, `{"code":429,"message":"too many sandboxes created: the team's create rate is exhausted, retry later"}`)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// validateAdmin checks --admin-listen and --enable-pprof.
func (o *serveOptions) validateAdmin() []error {
	if o.adminListen == "" {
		if o.enablePprof {
			return []error{errors.New("--enable-pprof needs --admin-listen: profiles are served on the admin listener only")}
		}
		return nil
	}
	_, port, err := net.SplitHostPort(o.adminListen)
	switch {
	case err != nil:
		return []error{fmt.Errorf("--admin-listen %q: want host:port, or empty to turn the operations endpoints off: %w", o.adminListen, err)}
	case o.adminListen == o.listen && port != "0":
		return []error{fmt.Errorf("--admin-listen %q: must differ from --listen", o.adminListen)}
	}
	return nil
}
