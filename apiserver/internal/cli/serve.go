package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/placement"
)

// Where serve's fleet comes from (--inventory).
const (
	// inventoryStatic follows the --sandboxd hosts itself; no Kubernetes.
	inventoryStatic = "static"
	// inventoryKube reads NodeInventory objects, SandboxTemplates and
	// API-key Secrets from Kubernetes.
	inventoryKube = "kube"
)

// DefaultCacheSyncTimeout bounds how long serve --inventory kube waits for
// its informer caches before giving up.
const DefaultCacheSyncTimeout = 2 * time.Minute

// serveOptions are the flags of `serve`.
type serveOptions struct {
	listen           string
	inventory        string
	sandboxd         []string
	kubeconfig       string
	cacheSyncTimeout time.Duration
	tokenFile        string
	keysFile         string
	sandboxDomain    string
	maxTimeout       time.Duration
	createRate       float64
	createBurst      int
	maxPerTeam       int
	placement        placement.Options
	staleness        kubeinventory.Options
}

// newServeOptions returns the defaults.
func newServeOptions() *serveOptions {
	return &serveOptions{
		listen:           ":8080",
		inventory:        inventoryStatic,
		cacheSyncTimeout: DefaultCacheSyncTimeout,
		maxTimeout:       e2bapi.DefaultMaxTimeout,
		createBurst:      20,
		placement:        placement.NewOptions(),
		staleness:        kubeinventory.NewOptions(),
	}
}

// addFlags registers serve's flags, each defaulting to o's current value.
func (o *serveOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", o.listen, "Address of the e2b API.")
	f.StringVar(&o.inventory, "inventory", o.inventory, "Where the fleet comes from: static (the --sandboxd hosts, no Kubernetes) or kube (NodeInventory objects, SandboxTemplates and API-key Secrets from Kubernetes).")
	f.StringSliceVar(&o.sandboxd, "sandboxd", o.sandboxd, "With --inventory static: a sandboxd's host:port (repeat or comma-separate for several).")
	f.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "With --inventory kube: the kubeconfig file; empty: $KUBECONFIG, else the pod's service account, else ~/.kube/config.")
	f.DurationVar(&o.cacheSyncTimeout, "cache-sync-timeout", o.cacheSyncTimeout, "With --inventory kube: how long to wait for the first list of NodeInventories, SandboxTemplates and API-key Secrets before giving up.")
	f.StringVar(&o.tokenFile, "sandboxd-token-file", o.tokenFile, "File holding the token sandboxd hosts accept (their --auth-token-file).")
	f.StringVar(&o.keysFile, "api-keys-file", o.keysFile, "With --inventory static: file of API keys, one \"team key\" per line, reloaded on change (sandbox-apiserver keys create adds one). With --inventory kube keys are Secrets instead.")
	f.StringVar(&o.sandboxDomain, "sandbox-domain", o.sandboxDomain, "Domain returned to SDKs, which then reach envd at 49983-<id>.<domain>; empty: the SDK's own.")
	f.DurationVar(&o.maxTimeout, "max-timeout", o.maxTimeout, "Longest lifetime a sandbox may be given.")
	f.Float64Var(&o.createRate, "create-rate-per-team", o.createRate, "Creates per second one team may make on average (0: no limit); beyond, 429.")
	f.IntVar(&o.createBurst, "create-burst-per-team", o.createBurst, "Creates one team may make at once above its rate.")
	f.IntVar(&o.maxPerTeam, "max-sandboxes-per-team", o.maxPerTeam, "Most sandboxes (running and paused) one team may have (0: no limit); beyond, creates get 429.")
	o.placement.AddFlags(f)
	o.staleness.AddFlags(f)
}

// Validate reports every option that cannot work, naming its flag.
func (o *serveOptions) Validate() error {
	var errs []error
	if o.listen == "" {
		errs = append(errs, errors.New("--listen is required"))
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
	if o.tokenFile == "" {
		errs = append(errs, errors.New("--sandboxd-token-file is required"))
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
	log := slog.Default()
	setKubeLogger(log)
	a, err := newApp(ctx, o, log)
	if err != nil {
		return err
	}
	defer a.stop()

	srv := &http.Server{Addr: o.listen, Handler: a.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 620 * time.Second}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	log.Info("serving the e2b API", append([]any{"listen", ln.Addr().String()}, a.describe...)...)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// app is a wired sandbox-apiserver: the e2b API's handler and the
// background parts it owns. serve runs it; tests build the same thing.
type app struct {
	handler http.Handler
	// describe is what serve logs about the fleet's origin.
	describe []any
	// kube holds the Kubernetes parts, nil with --inventory static.
	kube *kubeParts
	// stop ends the background parts and waits for them.
	stop func()
}

// newApp builds everything serve serves from validated options: the fleet
// source, key store and template catalog of the inventory mode, then the
// backend, the e2b API and authentication over them. With --inventory kube
// it returns once the informer caches have synced. The background parts
// run until a.stop or the end of ctx.
func newApp(ctx context.Context, o *serveOptions, log *slog.Logger) (*app, error) {
	token, err := readToken(o.tokenFile)
	if err != nil {
		return nil, err
	}
	clients := newClients(token)
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
		a.stop = func() { cancel(); _ = fs.Close() }
		src, keys = followHosts(runCtx, o.sandboxd, clients), fs
		a.describe = []any{"inventory", inventoryStatic, "hosts", o.sandboxd}
	case inventoryKube:
		k, err := startKube(ctx, o, log)
		if err != nil {
			return nil, err
		}
		a.kube, a.stop = k, k.stop
		src, keys, catalog = k.source, k.keys, k.templates
		a.describe = []any{"inventory", inventoryKube, "kube-apiserver", k.host}
	default:
		return nil, fmt.Errorf("--inventory %q: must be %s or %s", o.inventory, inventoryStatic, inventoryKube)
	}

	backend := fleet.New(fleet.Config{
		Source:  src,
		Placer:  placement.New(src, o.placement),
		Clients: clients,
		Catalog: catalog,
		Logger:  log,
	})
	api := e2bapi.New(e2bapi.Config{
		Backend:       limitTeams(backend, o.maxPerTeam),
		Team:          func(r *http.Request) (string, bool) { return auth.TeamFrom(r.Context()) },
		SandboxDomain: o.sandboxDomain,
		MaxTimeout:    o.maxTimeout,
		Logger:        log,
	})
	limiter := auth.NewRateLimiter(o.createRate, o.createBurst)
	mux := http.NewServeMux()
	mux.Handle("GET /health", api) // unauthenticated, as e2b's
	mux.Handle("/", auth.Middleware(keys, limitCreates(limiter, api)))
	a.handler = mux
	return a, nil
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

func readToken(path string) (string, error) {
	if path == "" {
		return "", errors.New("--sandboxd-token-file is required")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read --sandboxd-token-file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("--sandboxd-token-file %s is empty", path)
	}
	return token, nil
}
