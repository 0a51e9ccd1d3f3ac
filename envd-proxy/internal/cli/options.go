package cli

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/fleetsource"
	"github.com/skiff-dev/skiff/shared/logflags"
	"github.com/skiff-dev/skiff/shared/nodetoken"
)

const (
	// minAdvisedIdleTimeout is e2b's client-proxy idle timeout: the SDKs'
	// keep-alive pools are tuned to it.
	minAdvisedIdleTimeout = 610 * time.Second
)

const (
	// DefaultGoneNodeGrace is --gone-node-grace's default: three times a
	// sandboxd's default drain.
	DefaultGoneNodeGrace = 30 * time.Second
	// DefaultBodyIdleTimeout is longer than the longest pause a Connect
	// stream's requests make between keep-alives (the SDKs' interval is
	// 50 s, envd's default 90 s), so only a stalled body is cut.
	DefaultBodyIdleTimeout = 2 * time.Minute
	// DefaultMaxConnsPerClient is far above what one SDK process keeps
	// open (a connection per call in flight over HTTP/1.1, a few with
	// HTTP/2), and far below the descriptors a proxy has.
	DefaultMaxConnsPerClient = 1024
)

// Options are `sandbox-envd-proxy serve`'s flags.
type Options struct {
	// Listen is the proxy's address, E2B_SANDBOX_URL's host:port.
	Listen string
	// Admin is --admin-listen (/metrics, /healthz, /readyz) and
	// --enable-pprof.
	Admin daemon.AdminOptions
	// Options says where the fleet comes from: static (the --sandboxd hosts)
	// or kube (NodeInventory, freshness-filtered).
	fleetsource.Options
	// NodeTokens are the tokens the sandboxd hosts accept: one for all
	// (--sandboxd-token-file) or each host's, derived from the fleet key
	// (--node-token-key-file, kube mode).
	NodeTokens nodetoken.Options
	// TLSCert and TLSKey serve TLS (and HTTP/2 through ALPN).
	TLSCert, TLSKey string
	// IdleTimeout closes idle keep-alive client connections.
	IdleTimeout time.Duration
	// Shutdown bounds the drain of requests in flight on SIGTERM.
	Shutdown daemon.ShutdownOptions
	// BodyIdleTimeout cuts a request body that sends nothing this long; 0
	// never does.
	BodyIdleTimeout time.Duration
	// MaxConnsPerClient caps one client address's open connections; 0 is
	// no cap.
	MaxConnsPerClient int
	// TrustedProxies are --trusted-proxies: the reverse proxies in front
	// of this one, whose clients are counted by X-Forwarded-For.
	TrustedProxies []string
	// TokenRoutes bounds the X-Access-Token index; 0 turns token routing off.
	TokenRoutes int
	// IndexRefresh is how often the routing index is rebuilt besides (kube
	// mode) on every NodeInventory event.
	IndexRefresh time.Duration
	// GoneNodeGrace is how long a node out of the routing index stays
	// gone before its requests in flight are ended.
	GoneNodeGrace time.Duration
	// Log is --log-level and --log-format.
	Log logflags.Options
}

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{
		Listen:            ":3002",
		Admin:             daemon.AdminOptions{Listen: ":9092"},
		Options:           fleetsource.NewOptions(),
		IdleTimeout:       620 * time.Second,
		Shutdown:          daemon.ShutdownOptions{Timeout: 30 * time.Second},
		BodyIdleTimeout:   DefaultBodyIdleTimeout,
		MaxConnsPerClient: DefaultMaxConnsPerClient,
		TokenRoutes:       65536,
		IndexRefresh:      fleet.DefaultRefreshInterval,
		GoneNodeGrace:     DefaultGoneNodeGrace,
		Log:               logflags.New(logflags.Text),
	}
}

// AddFlags registers the flags, each defaulting to the field's value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "Address (host:port) of the proxy: what SDKs reach as E2B_SANDBOX_URL, or as <port>-<id>.<domain> through wildcard DNS. "+
		"HTTP/1.1, plus HTTP/2 through ALPN with --tls-cert.")
	o.Admin.AddFlags(fs, false)
	daemon.AddHelp(fs, "admin-listen", "/healthz is 200 while the process serves, /readyz once the fleet has synced.")
	o.Options.AddFlags(fs)
	o.NodeTokens.AddFlags(fs)
	daemon.AddHelp(fs, "sandboxd-token-file", "Sent as Skiff-Node-Token on every forwarded request, and as Authorization: Bearer on the Watch streams of static mode.")
	fs.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "Certificate (PEM) to serve TLS 1.2+ with, offering h2 and http/1.1 through ALPN; for <port>-<id>.<domain> hosts it must cover *.<domain>. Needs --tls-key.")
	fs.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "Private key (PEM) of --tls-cert; the two go together.")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", o.IdleTimeout, "Close a client's keep-alive connection after it idled this long; greater than 0, and keep it at least 610s (e2b's edge), "+
		"which the SDKs' pools expect (the proxy warns below that). There is no write timeout and no whole-request read timeout: streams last as long as they last "+
		"(a request body that stops moving: --body-idle-timeout).")
	o.Shutdown.AddFlags(fs, "")
	fs.DurationVar(&o.BodyIdleTimeout, "body-idle-timeout", o.BodyIdleTimeout, "Cut a request whose body sends nothing for this long: 408 in e2b's shape when no answer has started, and the connection closes. "+
		"A body that keeps moving may take as long as it takes (uploads, Connect streams); the default is above the longest pause between a stream's keep-alives (50 to 90s). 0 never cuts.")
	fs.IntVar(&o.MaxConnsPerClient, "max-conns-per-client", o.MaxConnsPerClient, "Most open connections from one client IP address (IPv4-mapped IPv6 counts as IPv4); each request on a connection beyond "+
		"gets 429 in e2b's shape with Retry-After: 1, and that connection closes. Behind a load balancer that does not keep the client's address (an L7 ingress) "+
		"every client shares the balancer's: name it in --trusted-proxies, or set 0 (no cap).")
	fs.StringSliceVar(&o.TrustedProxies, "trusted-proxies", o.TrustedProxies, "Addresses or CIDRs of reverse proxies in front of this one (an L7 ingress's pods), comma-separated: "+
		"their connections are not counted against --max-conns-per-client; instead each request through one counts, while it is in flight, for the client "+
		"X-Forwarded-For names (its rightmost address that is not a trusted proxy's), and one beyond the cap gets 429 on a connection that stays open. "+
		"A request from one keeps its X-Forwarded-Proto and X-Forwarded-Host (the client's https and public host, when the proxy ended TLS) for the sandbox's app: "+
		"name only proxies that set both themselves, never passing on a client's own. "+
		"Name only the proxies' own addresses, as narrowly as you can, and only proxies that set X-Forwarded-For: whatever connects from a trusted address is not capped by connections and may name any client.")
	fs.IntVar(&o.TokenRoutes, "token-routes", o.TokenRoutes, "Most X-Access-Token values remembered, least recently used out first, to route the /files calls of the JS SDKs 2.7 to 2.13, "+
		"which carry no routing headers; 0 turns that off.")
	fs.DurationVar(&o.IndexRefresh, "index-refresh-interval", o.IndexRefresh, "How often the routing index is rebuilt from the fleet; greater than 0. With --inventory kube it is also rebuilt "+
		"on every NodeInventory change, so this only matters while the freshness reference is capped by the clock; with static it bounds how long a host "+
		"whose stream broke can still be routed.")
	fs.DurationVar(&o.GoneNodeGrace, "gone-node-grace", o.GoneNodeGrace, "How long a node that left the routing index (stale, gone, or at another endpoint) must stay out before "+
		"the requests in flight to it are ended (502 before an answer, a cut stream after) and the connections kept to sandboxd hosts closed, rather than wait for TCP "+
		"to give up on a host that died silently. Longer than a sandboxd's --shutdown-timeout (10s), so that its streams finish in a restart's drain, "+
		"and than a static host's reconnect; 0 ends them at once.")
	o.Log.AddFlags(fs)
	daemon.AddHelp(fs, "log-level", "With debug, a line is logged per proxied request.")
}

// trustedProxies parses --trusted-proxies: a CIDR, or an address (the
// prefix of that address alone).
func (o *Options) trustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range o.TrustedProxies {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			if p.Addr().Is4In6() {
				// Peers are compared as IPv4: such a prefix would match none.
				errs = append(errs, fmt.Errorf("--trusted-proxies: write %q as an IPv4 CIDR", s))
				continue
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--trusted-proxies: %q is neither an address nor a CIDR", s))
			continue
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, errors.Join(errs...)
}

// Complete fills what follows from the flags given; the proxy has nothing
// to derive yet.
func (o *Options) Complete() error { return nil }

// Validate reports every option that cannot work, naming its flag.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		add("--listen %q: %w", o.Listen, err)
	}
	for _, err := range []error{o.Admin.Validate(false, map[string]string{"--listen": o.Listen}), o.Options.Validate(), o.Shutdown.Validate()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := o.NodeTokens.Validate(o.IsKube()); err != nil {
		errs = append(errs, err)
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		add("--tls-cert and --tls-key go together")
	}
	if o.IdleTimeout <= 0 {
		add("--idle-timeout must be positive, got %s", o.IdleTimeout)
	}
	if o.BodyIdleTimeout < 0 {
		add("--body-idle-timeout must not be negative, got %s", o.BodyIdleTimeout)
	}
	if o.MaxConnsPerClient < 0 {
		add("--max-conns-per-client must not be negative, got %d", o.MaxConnsPerClient)
	}
	if _, err := o.trustedProxies(); err != nil {
		errs = append(errs, err)
	}
	if len(o.TrustedProxies) > 0 && o.MaxConnsPerClient == 0 {
		add("--trusted-proxies needs the cap it refines: --max-conns-per-client is 0")
	}
	if o.TokenRoutes < 0 {
		add("--token-routes must not be negative, got %d", o.TokenRoutes)
	}
	if o.IndexRefresh <= 0 {
		add("--index-refresh-interval must be positive, got %s", o.IndexRefresh)
	}
	if o.GoneNodeGrace < 0 {
		add("--gone-node-grace must not be negative, got %s", o.GoneNodeGrace)
	}
	if err := o.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
