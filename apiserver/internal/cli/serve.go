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

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
)

type serveOptions struct {
	listen        string
	inventory     string
	sandboxd      []string
	tokenFile     string
	keysFile      string
	sandboxDomain string
	maxTimeout    time.Duration
	createRate    float64
	createBurst   int
	maxPerTeam    int
	placement     placement.Options
}

func serveCommand() *cobra.Command {
	o := serveOptions{placement: placement.NewOptions()}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the e2b REST API over the fleet",
		Long: `Serve the e2b REST API that unmodified e2b SDKs call (E2B_API_URL).

With --inventory static (single-host mode) it needs no Kubernetes: it
follows each --sandboxd over its Watch stream, and a host whose stream is
down leaves the fleet until it is back.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), &o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", ":8080", "Address of the e2b API.")
	f.StringVar(&o.inventory, "inventory", "static", "Where the fleet comes from: static (the --sandboxd hosts, no Kubernetes).")
	f.StringSliceVar(&o.sandboxd, "sandboxd", nil, "With --inventory static: a sandboxd's host:port (repeat or comma-separate for several).")
	f.StringVar(&o.tokenFile, "sandboxd-token-file", "", "File holding the token sandboxd hosts accept (their --auth-token-file).")
	f.StringVar(&o.keysFile, "api-keys-file", "", "File of API keys, one \"team key\" per line, reloaded on change (sandbox-apiserver keys create adds one).")
	f.StringVar(&o.sandboxDomain, "sandbox-domain", "", "Domain returned to SDKs, which then reach envd at 49983-<id>.<domain>; empty: the SDK's own.")
	f.DurationVar(&o.maxTimeout, "max-timeout", e2bapi.DefaultMaxTimeout, "Longest lifetime a sandbox may be given.")
	f.Float64Var(&o.createRate, "create-rate-per-team", 0, "Creates per second one team may make on average (0: no limit); beyond, 429.")
	f.IntVar(&o.createBurst, "create-burst-per-team", 20, "Creates one team may make at once above its rate.")
	f.IntVar(&o.maxPerTeam, "max-sandboxes-per-team", 0, "Most sandboxes (running and paused) one team may have (0: no limit); beyond, creates get 429.")
	o.placement.AddFlags(f)
	return cmd
}

func serve(ctx context.Context, o *serveOptions) error {
	log := slog.Default()
	if o.inventory != "static" {
		return fmt.Errorf("--inventory %q: only static is supported so far", o.inventory)
	}
	if len(o.sandboxd) == 0 {
		return errors.New("--inventory static needs at least one --sandboxd")
	}
	if o.keysFile == "" {
		return errors.New("--api-keys-file is required")
	}
	if err := o.placement.Validate(); err != nil {
		return err
	}
	token, err := readToken(o.tokenFile)
	if err != nil {
		return err
	}
	keys, err := auth.NewFileStore(o.keysFile, auth.FileStoreOptions{Logger: log})
	if err != nil {
		return err
	}
	defer keys.Close()

	src := inventory.NewStaticSource()
	clients := sandboxdapi.NewClients(token, &http.Client{})
	hostinventory.Follow(ctx, o.sandboxd, clients, src, hostinventory.Options{})
	backend := fleet.New(fleet.Config{
		Source:  src,
		Placer:  placement.New(src, o.placement),
		Clients: clients,
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

	srv := &http.Server{Addr: o.listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 620 * time.Second}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	log.Info("serving the e2b API", "listen", ln.Addr().String(), "hosts", o.sandboxd)
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
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return token, nil
}
