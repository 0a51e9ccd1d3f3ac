package cli

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/apiserver/internal/aggregated"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/view"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/warmpool"
	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/logflags"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/placement"
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

// DefaultShutdownTimeout bounds the drain on SIGTERM: e2b API calls are
// short (a create takes seconds).
const DefaultShutdownTimeout = 10 * time.Second

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
	admin            daemon.AdminOptions
	shutdown         daemon.ShutdownOptions
	fleet            fleetsource.Options
	cacheSyncTimeout time.Duration
	nodeTokens       nodetoken.Options
	keysFile         string
	sandboxDomain    string
	maxTimeout       time.Duration
	createRate       float64
	createBurst      int
	maxPerTeam       int
	placement        placement.Options
	log              logflags.Options
	// kubeAPI is the aggregated API's (with --inventory kube).
	kubeAPI          *aggregated.Options
	watchHistory     int
	warmPools        []string
	warmPoolInterval time.Duration
	lease            warmpool.LeaseOptions
	bookmarkInterval time.Duration
	// flags are the parsed flags, to tell a flag given from its default.
	flags *pflag.FlagSet
}

// newServeOptions returns the defaults.
func newServeOptions() *serveOptions {
	return &serveOptions{
		listen:           ":8080",
		readTimeout:      DefaultReadTimeout,
		admin:            daemon.AdminOptions{Listen: DefaultAdminListen},
		shutdown:         daemon.ShutdownOptions{Timeout: DefaultShutdownTimeout},
		fleet:            fleetsource.NewOptions(),
		cacheSyncTimeout: DefaultCacheSyncTimeout,
		maxTimeout:       e2bapi.DefaultMaxTimeout,
		createRate:       DefaultCreateRatePerTeam,
		createBurst:      DefaultCreateBurstPerTeam,
		maxPerTeam:       DefaultMaxSandboxesPerTeam,
		placement:        placement.NewOptions(),
		log:              logflags.New(logflags.Text),
		kubeAPI:          aggregated.NewOptions(),
		watchHistory:     view.DefaultHistory,
		warmPoolInterval: warmpool.DefaultInterval,
		lease:            warmpool.NewLeaseOptions(),
		bookmarkInterval: view.DefaultBookmarkInterval,
	}
}

// AddFlags registers serve's flags, each defaulting to o's current value.
func (o *serveOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", o.listen, "Address (host:port) of the e2b API: GET /health needs no key, every other route an X-API-Key.")
	f.DurationVar(&o.readTimeout, "read-timeout", o.readTimeout, "How long a request to the e2b API may take to arrive from its first byte, headers (at most 10s of it) and body; "+
		"a body not in by then answers 408 in e2b's shape and its connection is closed. A volume content upload's body may take as long as it moves: "+
		"it is cut (408) only when it sends nothing for this long. Greater than 0; it bounds neither a keep-alive connection "+
		"between requests (closed after 620s idle) nor how long an answer takes.")
	o.admin.AddFlags(f, true)
	daemon.AddHelp(f, "admin-listen", "/healthz is 200 while the process serves, /readyz once the fleet has synced; the endpoints serve from the start, while --inventory kube waits for its caches.")
	daemon.AddHelp(f, "enable-pprof", "A warning is logged when --admin-listen is not a loopback address.")
	o.shutdown.AddFlags(f, "")
	o.fleet.AddFlags(f)
	f.DurationVar(&o.cacheSyncTimeout, "cache-sync-timeout", o.cacheSyncTimeout, "With --inventory kube: how long serve waits for the first list of NodeInventories, "+
		"SandboxTemplates and API-key Secrets before it exits with an error; until then the e2b API answers nothing and /readyz says 503. Greater than 0.")
	f.StringVar(&o.keysFile, "api-keys-file", o.keysFile, "With --inventory static, and required there: file of API keys, one \"team key\" per line (# starts a comment; a team is a namespace name), "+
		"reloaded on change; sandbox-apiserver keys create adds one. Refused with --inventory kube, whose keys are Secrets labelled skiff.dev/api-key.")
	f.StringVar(&o.sandboxDomain, "sandbox-domain", o.sandboxDomain, "Domain returned to SDKs as the sandboxes' domain, so that they reach envd at 49983-<id>.<domain>; empty returns null (the SDK's own).")
	f.DurationVar(&o.maxTimeout, "max-timeout", o.maxTimeout, "Longest lifetime a request may give a sandbox (create, connect, resume, refresh or setTimeout), and the longest a sandbox runs from its create or last resume: a setTimeout, refresh or connect moves its end no later, as e2b's team limit does; greater than 0.")
	f.Float64Var(&o.createRate, "create-rate-per-team", o.createRate, "Creates per second one team may make on average (a fork of n counts as n creates); beyond, 429. 0 turns the rate off; not negative.")
	f.IntVar(&o.createBurst, "create-burst-per-team", o.createBurst, "Creates one team may make at once above its rate; at least 1 with a --create-rate-per-team.")
	f.IntVar(&o.maxPerTeam, "max-sandboxes-per-team", o.maxPerTeam, "Most sandboxes (running and paused) one team may have, creates and forks in flight counted; beyond, creates and forks get 429. 0 turns it off; not negative.")
	o.nodeTokens.AddFlags(f)
	daemon.AddHelp(f, "sandboxd-token-file", "Sent as Authorization: Bearer on every call to a sandboxd.")
	o.placement.AddFlags(f)
	o.log.AddFlags(f)
	o.kubeAPI.AddFlags(f)
	daemon.AddHelp(f, "secure-port", "With --inventory kube: the aggregated API sandbox.skiff.dev/v1beta1 (kubectl get sandboxes), which the APIService points at; 0 turns it off. "+
		"Refused with --inventory static, which has no kube-apiserver to delegate authentication to.")
	f.IntVar(&o.watchHistory, "watch-history", o.watchHistory, "With --inventory kube: how many sandbox changes the aggregated API keeps for watches that resume from a resourceVersion; "+
		"one older gets 410 Gone and the client lists again. At least 1.")
	f.DurationVar(&o.bookmarkInterval, "watch-bookmark-interval", o.bookmarkInterval, "With --inventory kube: how often a watch of sandboxes that allows bookmarks gets one. Greater than 0.")
	f.StringSliceVar(&o.warmPools, "warm-pool", o.warmPools, "With --inventory static: a warm pool, as template=replicas (base=4), repeated or comma-separated: that many started sandboxes "+
		"of the template are kept ready, so that a create claims one instead of starting one. Refused with --inventory kube, whose pools are SandboxWarmPool objects.")
	f.DurationVar(&o.warmPoolInterval, "warm-pool-interval", o.warmPoolInterval, "Longest time between two passes of the warm-pool driver; it also makes one on every inventory or pool change. Greater than 0.")
	o.lease.AddFlags(f)
	o.flags = f
}

// Complete fills what follows from the flags given: the aggregated API's
// delegated authentication and authorization reach the kube-apiserver
// with --kubeconfig unless their own kubeconfig flags say otherwise.
func (o *serveOptions) Complete() error {
	o.kubeAPI.Complete(o.fleet.Kubeconfig)
	o.lease.Complete()
	return nil
}

// Validate reports every option that cannot work, naming its flag.
func (o *serveOptions) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if o.listen == "" {
		add(errors.New("--listen is required"))
	} else if _, _, err := net.SplitHostPort(o.listen); err != nil {
		add(fmt.Errorf("--listen %q: want host:port: %w", o.listen, err))
	}
	if o.readTimeout <= 0 {
		add(fmt.Errorf("--read-timeout must be greater than 0, got %s", o.readTimeout))
	}
	add(o.admin.Validate(true, map[string]string{"--listen": o.listen}))
	add(o.shutdown.Validate())
	add(o.log.Validate())
	add(o.fleet.Validate())
	switch {
	case !o.fleet.IsKube() && o.keysFile == "" && o.fleet.Inventory == fleetsource.Static:
		add(errors.New("--inventory static needs --api-keys-file"))
	case o.fleet.IsKube() && o.keysFile != "":
		add(errors.New("--api-keys-file is only read with --inventory static: with --inventory kube, API keys are Secrets labelled skiff.dev/api-key in the team's namespace (sandbox-apiserver keys create --team T makes one)"))
	}
	if o.fleet.IsKube() && o.cacheSyncTimeout <= 0 {
		add(fmt.Errorf("--cache-sync-timeout must be greater than 0, got %s", o.cacheSyncTimeout))
	}
	add(o.nodeTokens.Validate(o.fleet.IsKube()))
	if o.maxTimeout <= 0 {
		add(fmt.Errorf("--max-timeout must be greater than 0, got %s", o.maxTimeout))
	}
	if o.createRate < 0 {
		add(fmt.Errorf("--create-rate-per-team must not be negative, got %g", o.createRate))
	}
	if o.createRate > 0 && o.createBurst < 1 {
		add(fmt.Errorf("--create-burst-per-team must be at least 1 with a --create-rate-per-team, got %d", o.createBurst))
	}
	if o.maxPerTeam < 0 {
		add(fmt.Errorf("--max-sandboxes-per-team must not be negative, got %d", o.maxPerTeam))
	}
	add(o.placement.Validate())
	if o.warmPoolInterval <= 0 {
		add(fmt.Errorf("--warm-pool-interval must be greater than 0, got %s", o.warmPoolInterval))
	}
	if o.fleet.IsKube() {
		add(o.lease.Validate())
		if len(o.warmPools) > 0 {
			add(errors.New("--warm-pool is only read with --inventory static: with --inventory kube, warm pools are SandboxWarmPool objects"))
		}
	} else if _, err := warmpool.ParseStatic(o.warmPools); err != nil {
		add(err)
	}
	switch {
	case o.fleet.IsKube() && o.kubeAPI.Enabled():
		add(o.kubeAPI.Validate())
		if o.watchHistory < 1 {
			add(fmt.Errorf("--watch-history must be at least 1, got %d", o.watchHistory))
		}
		if o.bookmarkInterval <= 0 {
			add(fmt.Errorf("--watch-bookmark-interval must be greater than 0, got %s", o.bookmarkInterval))
		}
	case !o.fleet.IsKube() && o.flags != nil && o.flags.Changed("secure-port") && o.kubeAPI.Enabled():
		add(errors.New("--secure-port serves the aggregated API, which needs --inventory kube: with --inventory static there is no kube-apiserver to delegate to"))
	}
	return errors.Join(errs...)
}
