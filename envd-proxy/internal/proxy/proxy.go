// Package proxy is the envd proxy's data path: it finds the sandbox a
// request is for (package route), the node that runs it (package fleet),
// and streams the request to that node's sandboxd, whose relay forwards it
// into the sandbox's port.
//
// Nothing is buffered: every chunk of a response is flushed as it comes,
// request bodies stream at any size, upgrades (WebSocket) are spliced, and
// HTTP/1.1 requests are full duplex. A request for a sandbox that no fresh
// node runs gets e2b's 502 at once, without a connection to any node.
package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/envd-proxy/internal/route"
	"github.com/skiff-dev/skiff/shared/idlebody"
	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/tracing"
	"github.com/skiff-dev/skiff/wire"
)

// Locator finds the node that runs a sandbox (fleet.Index).
type Locator interface {
	Lookup(sandboxID string) (fleet.Node, bool)
}

// Config is what a Proxy needs.
type Config struct {
	// Fleet finds the node of a sandbox.
	Fleet Locator
	// Tokens maps access tokens to sandboxes for requests that carry only
	// a token; nil turns token routing off.
	Tokens *route.Tokens
	// NodeToken returns the token of the named node's sandboxd, which the
	// node's requests carry as wire.NodeTokenHeader (nodetoken.Tokens.For).
	NodeToken func(node string) string
	// Ready reports whether the fleet view has synced; until it has, every
	// request gets 503, not a 502 that SDKs take for "the sandbox is gone".
	// Nil means always.
	Ready func() bool
	// BodyIdleTimeout cuts a request whose body sends nothing for this
	// long (408); 0 never does.
	BodyIdleTimeout time.Duration
	// TrustedProxies are the reverse proxies in front of this one (an L7
	// ingress that ends TLS): the X-Forwarded-Proto and X-Forwarded-Host
	// of a request from one of them are the client's, and pass on.
	TrustedProxies []netip.Prefix
	// Transport reaches sandboxd; nil means NewTransport with defaults.
	Transport http.RoundTripper
	// Metrics may be nil.
	Metrics *Metrics
	// Logger defaults to slog.Default(). It never receives a token, a
	// header or a query string.
	Logger *slog.Logger
}

// Proxy is the handler of the proxy's listener.
type Proxy struct {
	fleet     Locator
	ready     func() bool
	tokens    *route.Tokens
	nodeToken func(node string) string
	bodyIdle  time.Duration
	trusted   []netip.Prefix
	metrics   *Metrics
	log       *slog.Logger
	rp        *httputil.ReverseProxy
	handler   http.Handler // serve, under the "proxy" span with tracing on
	transport http.RoundTripper

	mu sync.Mutex
	// inflight are the requests forwarded now, by node name, each with
	// the cancel of its context: NodesGone ends those of a dead node.
	inflight map[string]map[*forward]context.CancelCauseFunc
}

// errNodeGone ends the requests in flight to a node that left the fleet
// (its inventory went stale: its host is dead or cut off).
var errNodeGone = errors.New("the sandbox's host left the fleet")

// NodesGone ends the requests in flight to nodes, which the fleet dropped
// a while ago (fleet.Index.OnGone, after --gone-node-grace), at the
// endpoints they had, and closes the idle connections kept to sandboxd
// hosts: a request to a dead host would otherwise wait for TCP to give up
// (minutes), and one sent on a kept connection to it as long. A request
// not yet answered gets a 502; a stream already answered is cut.
func (p *Proxy) NodesGone(nodes []fleet.Node) {
	p.mu.Lock()
	var cancels []context.CancelCauseFunc
	for _, n := range nodes {
		for fw, cancel := range p.inflight[n.Name] {
			if fw.node.Endpoint == n.Endpoint { // not one to where it is now
				cancels = append(cancels, cancel)
			}
		}
	}
	p.mu.Unlock()
	for _, cancel := range cancels {
		cancel(errNodeGone)
	}
	if c, ok := p.transport.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	if len(cancels) > 0 {
		p.log.Info("ended the requests in flight to hosts that left the fleet", "nodes", len(nodes), "requests", len(cancels))
	}
}

// track registers fw, forwarded to node, until the returned func is called.
func (p *Proxy) track(node string, fw *forward, cancel context.CancelCauseFunc) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight == nil {
		p.inflight = map[string]map[*forward]context.CancelCauseFunc{}
	}
	m := p.inflight[node]
	if m == nil {
		m = map[*forward]context.CancelCauseFunc{}
		p.inflight[node] = m
	}
	m[fw] = cancel
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		// m is still the node's map: one is dropped only when empty.
		delete(m, fw)
		if len(m) == 0 {
			delete(p.inflight, node)
		}
	}
}

// New returns the proxy handler.
func New(cfg Config) *Proxy {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(cfg.Tokens)
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport(TransportOptions{}, cfg.Metrics)
	}
	if cfg.Ready == nil {
		cfg.Ready = func() bool { return true }
	}
	p := &Proxy{fleet: cfg.Fleet, ready: cfg.Ready, tokens: cfg.Tokens, nodeToken: cfg.NodeToken, bodyIdle: cfg.BodyIdleTimeout,
		trusted: cfg.TrustedProxies, transport: cfg.Transport,
		metrics: cfg.Metrics, log: cfg.Logger}
	p.rp = &httputil.ReverseProxy{
		Rewrite: p.rewrite,
		// With tracing on, the call to sandboxd is a client span whose
		// context goes to sandboxd's relay in traceparent.
		Transport: tracing.Transport(cfg.Transport, tracing.Name("proxy to sandboxd"), nil),
		// streamBody flushes every write itself. Left at 0, ReverseProxy
		// sends a body of known length's headers with its first bytes, not
		// in a write of their own; it still flushes the headers of a body
		// of unknown length (a stream) at once.
		FlushInterval:  0,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.proxyError,
		BufferPool:     bufferPool{},
		// What ReverseProxy logs itself (a body copy that ended early) is
		// reported by bodyFailed and proxyError; its own lines are details.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	p.handler = tracing.Handler(http.HandlerFunc(p.serve), tracing.Name("proxy"), nil)
	return p
}

// forward is one request's state between ServeHTTP and the reverse
// proxy's hooks.
type forward struct {
	target route.Target
	node   fleet.Node
	w      http.ResponseWriter // the client's, for streamBody
	token  string              // the client's X-Access-Token, for token learning
	method string
	path   string
	body   *idlebody.Body // nil: no body, or no idle timeout
	start  time.Time
	status int // what the client got; 0 while none
}

type forwardKey struct{}

// ServeHTTP routes one request (see the package comment) and streams it to
// the sandbox's node, or answers it itself: 400 for a request that names no
// sandbox, 404 for envd's internal routes, 503 before the fleet has synced,
// e2b's 502 for a sandbox on no fresh node. With tracing on
// (tracing.Enabled) each request is a "proxy" span.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.handler.ServeHTTP(w, r) }

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	open := p.metrics.openHTTP
	if r.Header.Get("Upgrade") != "" {
		open = p.metrics.openUpgrade
	}
	open.Inc()
	defer open.Dec()
	debug := p.log.Enabled(r.Context(), slog.LevelDebug)
	body := p.watchBody(w, r)

	t, err := route.Resolve(r, p.tokens)
	if err != nil {
		if debug {
			p.log.DebugContext(r.Context(), "request names no routable sandbox", "method", r.Method, "error", err)
		}
		wire.WriteError(w, http.StatusBadRequest, err.Error())
		p.metrics.request(route.ByNone, http.StatusBadRequest)
		return
	}
	if t.IsEnvd() && blockedPath(r.URL.Path) {
		wire.WriteError(w, http.StatusNotFound, "404 page not found")
		p.metrics.request(t.By, http.StatusNotFound)
		return
	}
	if !p.ready() {
		w.Header().Set("Retry-After", "1")
		wire.WriteError(w, http.StatusServiceUnavailable, "the proxy is starting and has not synced the fleet's inventory yet; retry")
		p.metrics.request(t.By, http.StatusServiceUnavailable)
		return
	}
	node, ok := p.fleet.Lookup(t.SandboxID)
	if !ok {
		if t.By == route.ByToken {
			p.tokens.Forget(r.Header.Get(wire.AccessTokenHeader), t.SandboxID)
		}
		if debug {
			p.log.DebugContext(r.Context(), "sandbox on no fresh node", "sandbox", t.SandboxID, "port", t.Port, "routed_by", t.By)
		}
		routing.WriteSandboxNotFound(w, r, t.SandboxID)
		p.metrics.request(t.By, http.StatusBadGateway)
		return
	}
	if r.ProtoMajor == 1 {
		// Let a sandbox answer while the client still sends (HTTP/2 always
		// can); an error means the writer cannot, and nothing changes.
		_ = http.NewResponseController(w).EnableFullDuplex()
	}
	lw := &lockedWriter{ResponseWriter: w}
	fw := &forward{target: t, node: node, w: lw, method: r.Method, path: r.URL.Path, start: time.Now()}
	if t.IsEnvd() {
		fw.token = r.Header.Get(wire.AccessTokenHeader)
	}
	fw.body = body
	// Deferred: ReverseProxy ends a response cut midway by panicking with
	// http.ErrAbortHandler, which the server recovers from quietly.
	defer func() {
		p.metrics.request(t.By, fw.status)
		if debug {
			p.log.DebugContext(r.Context(), "proxied", "method", r.Method, "sandbox", t.SandboxID, "port", t.Port,
				"routed_by", t.By, "node", node.Name, "status", fw.status, "duration", time.Since(fw.start))
		}
	}()
	ctx, cancel := context.WithCancelCause(context.WithValue(r.Context(), forwardKey{}, fw))
	defer cancel(nil)
	defer p.track(node.Name, fw, cancel)()
	p.rp.ServeHTTP(lw, r.WithContext(ctx))
}

// watchBody puts a request's body, if it has one, under the body idle
// timeout (package idlebody), and returns it; nil when there is none.
// r.Body stays as it is: rewrite wraps the forwarded request's body.
func (p *Proxy) watchBody(w http.ResponseWriter, r *http.Request) *idlebody.Body {
	if r.Header.Get("Upgrade") != "" {
		return nil
	}
	return idlebody.Watch(w, r, p.bodyIdle)
}

// blockedPath reports whether path, or its cleaned form (which envd's mux
// would redirect to), is one of envd's internal routes.
func blockedPath(p string) bool {
	return routing.BlockedEnvdPath(p) || routing.BlockedEnvdPath(path.Clean("/"+p))
}

// rewrite points the outgoing request at the node's sandboxd, keeping the
// client's host, path, query and headers. It sets the routing headers to
// the target (however the client named it), so that sandboxd routes by
// them, and the node's token, which a client can never supply.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	fw := pr.In.Context().Value(forwardKey{}).(*forward)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = fw.node.Endpoint
	pr.Out.Host = pr.In.Host
	if fw.body != nil && pr.Out.Body != nil {
		// The outgoing request's field only: it holds the same body as
		// the server's r.Body (Request.Clone shares it), which keeps
		// net/http's own type, so that net/http still decides from it
		// whether the connection can serve another request (see
		// watchBody).
		pr.Out.Body = fw.body.Wrap(pr.Out.Body)
	}
	if xff := pr.In.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		pr.Out.Header["X-Forwarded-For"] = xff // SetXForwarded appends the client
	}
	pr.SetXForwarded()
	// An ingress that ended TLS knows the client's scheme and host; this
	// hop's (http, its own address) would tell the sandbox's app that it
	// is served over plain http.
	var forwarded []string
	if p.fromTrusted(pr.In) {
		forwarded = []string{"X-Forwarded-Proto", "X-Forwarded-Host"}
	}
	routing.PassOn(pr, forwarded...)
	h := pr.Out.Header
	for name := range h {
		if isNodeTokenHeader(name) {
			delete(h, name)
		}
	}
	h.Set(wire.NodeTokenHeader, p.nodeToken(fw.node.Name))
	h.Set(wire.SandboxIDHeader, fw.target.SandboxID)
	h.Set(wire.SandboxPortHeader, strconv.Itoa(int(fw.target.Port)))
}

// fromTrusted reports whether r came from one of the trusted proxies.
func (p *Proxy) fromTrusted(r *http.Request) bool {
	if len(p.trusted) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	addr := ap.Addr().Unmap().WithZone("")
	for _, pfx := range p.trusted {
		if pfx.Contains(addr) {
			return true
		}
	}
	return false
}

// isNodeTokenHeader reports whether a header name is, or could be taken
// for, wire.NodeTokenHeader (any case, '_' for '-').
func isNodeTokenHeader(name string) bool {
	return len(name) == len(wire.NodeTokenHeader) && strings.EqualFold(strings.ReplaceAll(name, "_", "-"), wire.NodeTokenHeader)
}

// modifyResponse records the answer's status and latency, and learns or
// forgets the request's access token.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	fw, ok := resp.Request.Context().Value(forwardKey{}).(*forward)
	if !ok {
		return nil
	}
	fw.status = resp.StatusCode
	p.metrics.upstreamLatency.Observe(time.Since(fw.start).Seconds())
	if resp.StatusCode != http.StatusSwitchingProtocols && fw.w != nil {
		// An upgrade's body is the connection itself: ReverseProxy splices it.
		resp.Body = &streamBody{ReadCloser: resp.Body, w: fw.w, fail: func(err error) { p.bodyFailed(resp.Request, fw, err) }}
	}
	if fw.token == "" {
		return nil
	}
	switch {
	case fw.target.By == route.ByToken && resp.StatusCode == http.StatusBadGateway:
		p.tokens.Forget(fw.token, fw.target.SandboxID) // the sandbox is gone
	case learnable(fw.method, fw.path, fw.token, resp.StatusCode):
		p.tokens.Learn(fw.token, fw.target.SandboxID)
	}
	return nil
}

// learnable reports whether envd's answer to a request shows that the
// request's token belongs to its sandbox: only a success (2xx) to a request
// whose token envd checks. envd (envd/internal/server/auth.go) answers any
// OPTIONS (CORS preflights), GET and HEAD /health and POST /init without
// looking at the token, so a made-up token passes those; on every other
// route a wrong token gets 401. Nothing else shows that the token is right:
// a redirect, a 4xx (envd's mux answers 404 and 405 only after the token
// passed, but a 400 from sandboxd's relay comes before envd), or a 5xx
// (sandboxd answers 502 for a sandbox it does not have). A token that names
// its sandbox (sandboxd's own format) routes without the map and is not
// stored.
func learnable(method, p, token string, status int) bool {
	if status < 200 || status > 299 || method == http.MethodOptions {
		return false
	}
	switch strings.TrimRight(path.Clean("/"+p), "/") {
	case "/health", "/init":
		return false
	}
	_, named := sandboxid.FromAccessToken(token)
	return !named
}

// proxyError answers a failure to reach sandboxd or to read its answer.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	fw, _ := r.Context().Value(forwardKey{}).(*forward)
	if fw != nil && fw.body.TimedOut() {
		// The client stalled; its connection's read failed (which also
		// cancelled r's context), and it is closed after this answer.
		fw.status = http.StatusRequestTimeout
		p.log.InfoContext(r.Context(), "request body idle: cut", "sandbox", fw.target.SandboxID, "port", fw.target.Port,
			"idle_timeout", p.bodyIdle)
		w.Header().Set("Connection", "close")
		wire.WriteError(w, http.StatusRequestTimeout, "the request body sent nothing for "+p.bodyIdle.String()+"; the proxy cut it")
		return
	}
	if errors.Is(context.Cause(r.Context()), errNodeGone) {
		if fw != nil {
			fw.status = http.StatusBadGateway
		}
		wire.WriteError(w, http.StatusBadGateway, "the sandbox's host left the fleet (its inventory went stale, or it stopped answering); retry, or check that the sandbox is running")
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away (or the proxy is shutting down): nobody to answer
	}
	if fw != nil {
		fw.status = http.StatusBadGateway
		p.log.WarnContext(r.Context(), "forward to sandboxd failed", "sandbox", fw.target.SandboxID, "port", fw.target.Port,
			"node", fw.node.Name, "endpoint", fw.node.Endpoint, "error", err)
	}
	wire.WriteError(w, http.StatusBadGateway, "the sandbox's host is not reachable; retry, or check that the sandbox is running")
}

// TooManyConnections answers a request on a client connection beyond the
// proxy's per-client cap: 429 in e2b's shape, and the connection closes
// after it (HTTP/2: GOAWAY).
func (p *Proxy) TooManyConnections(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Connection", "close")
	h.Set("Retry-After", "1")
	wire.WriteError(w, http.StatusTooManyRequests, "too many connections from this client; reuse a connection or retry later")
	p.metrics.request(route.ByNone, http.StatusTooManyRequests)
}

// TooManyRequests answers a request beyond its client's cap that came
// through a trusted reverse proxy: 429 in e2b's shape with Retry-After, on
// a connection that stays open (the reverse proxy's, which its other
// clients share).
func (p *Proxy) TooManyRequests(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Retry-After", "1")
	wire.WriteError(w, http.StatusTooManyRequests, "too many requests in flight from this client; retry later")
	p.metrics.request(route.ByNone, http.StatusTooManyRequests)
}

// bodyFailed logs a response body that ended early: sandboxd (or the
// sandbox) failing midway is a warning; the client going away is not.
func (p *Proxy) bodyFailed(r *http.Request, fw *forward, err error) {
	if fw.body.TimedOut() {
		p.log.InfoContext(r.Context(), "request body idle: cut", "sandbox", fw.target.SandboxID, "port", fw.target.Port,
			"idle_timeout", p.bodyIdle)
		return
	}
	if errors.Is(err, errClientWrite) || r.Context().Err() != nil {
		p.log.DebugContext(r.Context(), "client left during the response", "sandbox", fw.target.SandboxID, "port", fw.target.Port)
		return
	}
	p.log.WarnContext(r.Context(), "response from sandboxd ended early", "sandbox", fw.target.SandboxID, "port", fw.target.Port,
		"node", fw.node.Name, "error", err)
}
