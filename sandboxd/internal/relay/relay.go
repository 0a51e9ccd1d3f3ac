// Package relay is sandboxd's traffic edge into its sandboxes: a request
// naming a sandbox and port (E2b-Sandbox-Id / E2b-Sandbox-Port, or a
// `<port>-<id>` host, see shared/routing) is proxied to that port inside the
// sandbox, streaming both ways without buffering, upgrades (WebSocket)
// included. envd's internal routes are refused with 404; an unknown sandbox
// gets e2b's 502.
//
// A sandbox with public traffic off has a traffic access token: a request
// for any of its ports but envd's (envd checks its own X-Access-Token) must
// carry it in TrafficTokenHeader, else 401 (missing) or 403 (wrong). A
// request for a paused sandbox with auto-resume resumes it (AutoResumer)
// and is then forwarded — for envd's port, only a request with its access
// token (any path) or a signed /files URL, else e2b's 403; any other
// paused sandbox gets e2b's 502.
package relay

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/envd/filesig"
	"github.com/skiff-dev/skiff/sandboxd/internal/network"
	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/tracing"
	"github.com/skiff-dev/skiff/wire"
)

// TrafficTokenHeader carries a private sandbox's traffic access token, as
// e2b's SDKs send it. It never reaches the sandbox.
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// ErrUnknownSandbox is what a Resolver returns for a sandbox that is not
// (or no longer) on this host, or that no one may reach (a warm one).
var ErrUnknownSandbox = errors.New("unknown sandbox")

// Sandbox is what the relay needs to know about a sandbox.
type Sandbox struct {
	// Address is the IP (without port) at which the sandbox's ports are
	// reachable from sandboxd.
	Address string
	// NetNS is the path of the sandbox's network namespace: a port that
	// Address refuses is dialled on the loopback in it too (a server bound
	// to 127.0.0.1, see dialSandbox). Empty: Address only.
	NetNS string
	// TrafficAccessToken, when set, must come in TrafficTokenHeader with
	// every request for a port other than envd's.
	TrafficAccessToken string
	// EnvdAccessToken is the token envd checks (X-Access-Token). A
	// request for envd's port wakes a paused sandbox only with it, or with
	// a /files URL signed with it.
	EnvdAccessToken string
	// Paused: its ports answer nothing until it is resumed.
	Paused bool
	// AutoResume: a request for it while paused resumes it.
	AutoResume bool
	// Boot counts the times it was booted afresh (after a pause that kept
	// its files only): connections kept to an earlier boot's processes
	// are never reused, since the address is the same and the processes
	// are not.
	Boot int
	// MaskRequestHost, when set, is the Host a request for a port other
	// than envd's reaches the sandbox with (e2b's maskRequestHost): each
	// "${PORT}" in it is the port, and X-Forwarded-Host stays the public
	// Host (the envd proxy's X-Forwarded-Host, else the request's own).
	MaskRequestHost string
}

// MaskPortPlaceholder is replaced by the port in a MaskRequestHost.
const MaskPortPlaceholder = "${PORT}"

// Resolver looks a sandbox up.
type Resolver interface {
	Resolve(ctx context.Context, sandboxID string) (Sandbox, error)
}

// AutoResumer is an optional capability of a Resolver: it resumes a paused
// sandbox that has auto-resume, for a request that needs it, and returns
// the sandbox as it is then (running, unless it went away). Concurrent
// calls for one sandbox resume it once.
type AutoResumer interface {
	AutoResume(ctx context.Context, sandboxID string) (Sandbox, error)
}

// New returns the relay handler.
func New(r Resolver) http.Handler {
	h := &handler{resolver: r}
	h.resumer, _ = r.(AutoResumer)
	h.proxy = &httputil.ReverseProxy{
		Rewrite: h.rewrite,
		// With tracing on, the request into the sandbox is a client
		// span, and its traceparent reaches the sandbox's port.
		Transport:     tracing.Transport(newTransport(), tracing.Name("relay to sandbox"), nil),
		FlushInterval: -1, // flush every write: streams and SSE must not wait
		ErrorHandler:  h.proxyError,
		BufferPool:    bufferPool{},
		// An answer cut midway is logged by watchBody, with the sandbox
		// named; ReverseProxy's own line for it (and its rare others) go
		// to the debug level.
		ModifyResponse: watchBody,
		ErrorLog:       log.New(debugLog{}, "", 0),
	}
	return h
}

// watchBody makes an answer that ends early (the sandbox's process died,
// or the connection into it was cut) a warning that names the sandbox and
// port. The client going away is not logged.
func watchBody(resp *http.Response) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return nil // the body is the upgraded connection
	}
	rt, _ := resp.Request.Context().Value(targetKey{}).(relayed)
	resp.Body = &watchedBody{ReadCloser: resp.Body, ctx: resp.Request.Context(), target: rt.target}
	return nil
}

type watchedBody struct {
	io.ReadCloser
	ctx    context.Context
	target routing.Target
	logged bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !b.logged && b.ctx.Err() == nil {
		b.logged = true
		slog.WarnContext(b.ctx, "answer from sandbox ended early", "sandbox", b.target.SandboxID, "port", b.target.Port, "error", err)
	}
	return n, err
}

// debugLog writes ReverseProxy's log lines (free text, an error's among
// it) to slog's default logger at debug level, under "text".
type debugLog struct{}

func (debugLog) Write(p []byte) (int, error) {
	slog.Debug("reverse proxy log", "component", "relay", "text", strings.TrimSpace(string(p)))
	return len(p), nil
}

type handler struct {
	resolver Resolver
	resumer  AutoResumer // nil when the resolver cannot resume
	proxy    *httputil.ReverseProxy
}

// copyBuffer is the size of the buffers that copy bodies: larger than
// ReverseProxy's 32 KiB, so a bulk download takes fewer writes and flushes.
const copyBuffer = 256 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, copyBuffer); return &b }}

// bufferPool lends ReverseProxy its copy buffers.
type bufferPool struct{}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

type targetKey struct{}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, err := routing.Parse(r)
	if err != nil {
		wire.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	if t.IsEnvd() && routing.BlockedEnvdPath(r.URL.Path) {
		wire.WriteError(w, http.StatusNotFound, "404 page not found")
		return
	}
	sb, err := h.resolver.Resolve(r.Context(), t.SandboxID)
	if err != nil {
		if !errors.Is(err, ErrUnknownSandbox) {
			slog.ErrorContext(r.Context(), "resolve sandbox", "sandbox", t.SandboxID, "error", err)
		}
		routing.WriteSandboxNotFound(w, r, t.SandboxID)
		return
	}
	// The token first: a request that may not reach the sandbox must not
	// wake it either.
	if !t.IsEnvd() && sb.TrafficAccessToken != "" {
		if msg := checkTrafficToken(r, sb.TrafficAccessToken); msg != "" {
			wire.Write(w, wire.Error{SandboxID: t.SandboxID, Code: http.StatusForbidden, Message: msg})
			return
		}
	}
	if sb.Paused {
		if !sb.AutoResume || h.resumer == nil {
			routing.WriteSandboxNotFound(w, r, t.SandboxID)
			return
		}
		if t.IsEnvd() && !mayWakeEnvd(r, sb.EnvdAccessToken) {
			if sb.EnvdAccessToken == "" {
				routing.WriteSandboxNotFound(w, r, t.SandboxID)
				return
			}
			// e2b's edge's answer to a resume its API refuses.
			wire.Write(w, wire.Error{SandboxID: t.SandboxID, Code: http.StatusForbidden, Message: resumeDeniedMessage})
			return
		}
		if sb, err = h.resumer.AutoResume(r.Context(), t.SandboxID); err != nil {
			h.resumeFailed(w, r, t.SandboxID, err)
			return
		}
	}
	if sb.Paused || sb.Address == "" {
		routing.WriteSandboxNotFound(w, r, t.SandboxID)
		return
	}
	// The URL names the sandbox, not its address, and the transport dials
	// the address (dial): kept connections are pooled per sandbox. An
	// address passes to a new sandbox after a kill, and a connection kept
	// from the old one would reach the new one's kernel, which resets it —
	// a POST (every Connect call) is not retried, so an SDK's first call
	// into the new sandbox failed.
	if r.ProtoMajor == 1 {
		// Read the body while the sandbox answers: Go's HTTP/1.1 server
		// otherwise discards and closes what is left of it when the
		// response starts. Envd answers a Connect call once it has the
		// message, often before the transport has seen the body end, and
		// the transport then failed on the closed body and cut the answer.
		// An error means this writer cannot, and nothing changes.
		_ = http.NewResponseController(w).EnableFullDuplex()
	}
	port := strconv.Itoa(int(t.Port))
	// The host names the idle-connection pool: one per sandbox, boot and
	// port (the request's own Host header is kept, below).
	poolHost := t.SandboxID
	if sb.Boot > 0 {
		poolHost += ".boot" + strconv.Itoa(sb.Boot)
	}
	upstream := &url.URL{Scheme: "http", Host: net.JoinHostPort(poolHost, port)}
	addr := net.JoinHostPort(sb.Address, port)
	rt := relayed{target: t, upstream: upstream, addr: addr, netns: sb.NetNS}
	if !t.IsEnvd() && sb.MaskRequestHost != "" {
		rt.host = strings.ReplaceAll(sb.MaskRequestHost, MaskPortPlaceholder, port)
	}
	h.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, rt)))
}

// resumeFailed answers a failed auto-resume with 502: e2b's "not found"
// when the sandbox went away meanwhile, else a message that says the
// resume failed (the cause is logged, not sent).
func (h *handler) resumeFailed(w http.ResponseWriter, r *http.Request, id string, err error) {
	switch {
	case errors.Is(err, ErrUnknownSandbox):
		routing.WriteSandboxNotFound(w, r, id)
	case r.Context().Err() != nil:
		// the client went away
	default:
		slog.ErrorContext(r.Context(), "auto-resume sandbox", "sandbox", id, "error", err)
		wire.WriteError(w, http.StatusBadGateway, "the sandbox "+id+" is paused and could not be resumed")
	}
}

// resumeDeniedMessage is e2b's edge's message for a request that may not
// wake a paused sandbox.
const resumeDeniedMessage = "This sandbox can't be resumed with the credentials provided. Check your access token and try again."

// mayWakeEnvd reports whether a request for envd's port may wake its
// paused sandbox: as e2b's API decides, one carrying the sandbox's access
// token (X-Access-Token), whatever its path (the SDK's isRunning, a
// /health with the token, wakes it on e2b too), or, for /files, a URL
// signed with it. Without a token to check (a record with none: sandboxd
// gives every sandbox one), a health check or a CORS preflight never
// wakes it: anyone could keep it awake, and resumed with a full new
// timeout, for nothing.
// The token is compared in constant time, of digests.
func mayWakeEnvd(r *http.Request, token string) bool {
	if token == "" {
		return r.Method != http.MethodOptions && r.URL.Path != "/health"
	}
	if got := r.Header.Get(wire.AccessTokenHeader); got != "" {
		a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(token))
		return subtle.ConstantTimeCompare(a[:], b[:]) == 1
	}
	if r.URL.Path != "/files" {
		return false
	}
	op := filesig.OpRead
	if r.Method == http.MethodPost {
		op = filesig.OpWrite
	}
	return filesig.Verify(r.URL.Query(), op, token, time.Now())
}

// checkTrafficToken compares the request's traffic token with want, in
// constant time (of digests, so lengths do not show): "" when it matches,
// else the message to answer with 403, e2b's edge's own for a missing and
// for a wrong token (e2b-dev/infra, packages/shared/pkg/proxy/template).
func checkTrafficToken(r *http.Request, want string) string {
	got := r.Header.Get(TrafficTokenHeader)
	if got == "" {
		return "Sandbox is secured with traffic access token. Token header '" + trafficTokenHeaderLower + "' is missing"
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	if subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
		return "Sandbox is secured with traffic access token. Provided token in header '" + trafficTokenHeaderLower + "' is invalid"
	}
	return ""
}

// trafficTokenHeaderLower is TrafficTokenHeader as e2b's messages name it.
const trafficTokenHeaderLower = "e2b-traffic-access-token"

type relayed struct {
	target   routing.Target
	upstream *url.URL // http://<sandbox ID>[.boot<n>]:<port>
	addr     string   // the sandbox's address and port, which dial dials
	netns    string   // the sandbox's network namespace, "" if unknown
	host     string   // the masked Host, if any
}

// forwardedHeaders are the envd proxy's account of the client's request.
var forwardedHeaders = [...]string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// rewrite points the outgoing request at the sandbox's port. The routing
// headers stay (envd ignores them) and the client's X-Access-Token goes
// through for envd to check; the traffic access token does not: the
// sandbox's own code must not learn it.
//
// X-Forwarded-For, -Host and -Proto reach the sandbox as the envd proxy
// sent them: they describe the client's request (an https one, from the
// client's address), and this hop's values (http, the proxy's address)
// would tell an app behind https that it is served over http. Only a
// caller with the node token reaches the relay. A request without them
// (a caller of sandboxd's port itself) gets this hop's; a masked Host
// (e2b's maskRequestHost) leaves X-Forwarded-Host the public one.
func (h *handler) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(targetKey{}).(relayed)
	pr.SetURL(rt.upstream)
	pr.Out.Host = pr.In.Host
	pr.Out.Header.Del(TrafficTokenHeader)
	pr.SetXForwarded()
	routing.PassOn(pr, forwardedHeaders[:]...)
	if rt.host != "" {
		pr.Out.Host = rt.host
	}
}

// portClosedMessage is e2b's proxy's message for a port nothing answers on.
const portClosedMessage = "The sandbox is running but port is not open"

// proxyError answers a failure to reach the sandbox's port: the sandbox is
// gone or the port has no listener, which e2b's edge reports as 502.
func (h *handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(targetKey{}).(relayed)
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	slog.WarnContext(r.Context(), "relay to sandbox failed", "sandbox", rt.target.SandboxID, "port", rt.target.Port, "error", err)
	// The request's body may be unread, and the server reads it on its
	// own while the answer goes (full duplex, see ServeHTTP): reusing the
	// connection then read the next request beside that read, and Go's
	// server panicked ("invalid concurrent Body.Read call"). So this
	// connection ends with the answer.
	w.Header().Set("Connection", "close")
	// The cause (a dial error naming the sandbox's address) is logged, not
	// sent: addresses inside the host are none of the client's business.
	// The body is e2b's proxy's for a closed port.
	wire.Write(w, wire.Error{SandboxID: rt.target.SandboxID, Code: http.StatusBadGateway, Message: portClosedMessage, Port: int(rt.target.Port)})
}

// refusedBackoff are the waits between the dials of a port that refuses:
// e2b's proxy tries 5 times, 100 to 400 ms apart (1 s in all), so that a
// request right after a server's start, or its restart, reaches it.
var refusedBackoff = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond}

// dialSandbox connects to the sandbox's port. A server that the sandbox
// binds to its loopback, 127.0.0.1 or ::1 (many dev servers do by
// default), refuses its address;
// e2b makes such a port reachable all the same (envd forwards it with
// socat), so a refused dial is tried again on the loopback of the
// sandbox's namespace, from a socket made inside it. Both refusing, it
// tries again after refusedBackoff's waits, whatever the loopback said:
// under gVisor the host cannot reach the sandbox's loopback, and a server
// still starting is reached when it listens. The error is the address's.
func dialSandbox(ctx context.Context, d *net.Dialer, proto string, rt relayed) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		c, err := d.DialContext(ctx, proto, rt.addr)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return c, err
		}
		if rt.netns != "" {
			if c, lerr := network.DialLoopback(ctx, rt.netns, rt.target.Port); lerr == nil {
				return c, nil
			}
		}
		if attempt == len(refusedBackoff) {
			return nil, err
		}
		timer := time.NewTimer(refusedBackoff[attempt])
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
}

// newTransport is the relay's way into sandboxes. It passes bodies as they
// are: Go's default transport asks for gzip when the client did not and
// unpacks it, so a 100 MB download was compressed by envd and decompressed
// here, at a third of the throughput. It never goes through a proxy of the
// environment (a sandbox's address is on this host), and keeps enough idle
// connections per sandbox for an SDK's concurrent calls, pooled by sandbox
// ID (see ServeHTTP).
func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	t.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		rt, ok := ctx.Value(targetKey{}).(relayed)
		if !ok {
			return nil, errors.New("relay: a connection dialled without a sandbox")
		}
		return dialSandbox(ctx, d, network, rt)
	}
	t.Proxy = nil
	t.DisableCompression = true
	t.MaxIdleConns = 0 // no limit beyond the per-sandbox one
	t.MaxIdleConnsPerHost = 64
	// A sandbox's server is its tenant's: the headers of its answers are
	// held to what the relay takes of a request's (Go's default, 10 MiB,
	// let one tenant pin that much of sandboxd's memory per request).
	t.MaxResponseHeaderBytes = maxResponseHeaderBytes
	return t
}

// maxResponseHeaderBytes bounds the headers of a sandbox's answer; past
// it the relay answers 502.
const maxResponseHeaderBytes = 1 << 20
