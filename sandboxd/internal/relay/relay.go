// Package relay is sandboxd's traffic edge into its sandboxes: a request
// naming a sandbox and port (E2b-Sandbox-Id / E2b-Sandbox-Port, or a
// `<port>-<id>` host, see shared/routing) is proxied to that port inside the
// sandbox, streaming both ways without buffering, upgrades (WebSocket)
// included. envd's internal routes are refused with 404; an unknown sandbox
// gets e2b's 502.
package relay

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"

	"github.com/skiff-dev/skiff/shared/routing"
)

// ErrUnknownSandbox is what a Resolver returns for a sandbox that is not
// (or no longer) on this host.
var ErrUnknownSandbox = errors.New("unknown sandbox")

// Resolver finds the address (an IP, without port) at which a sandbox's
// ports are reachable from sandboxd.
type Resolver interface {
	Resolve(ctx context.Context, sandboxID string) (string, error)
}

// New returns the relay handler.
func New(r Resolver) http.Handler {
	h := &handler{resolver: r}
	h.proxy = &httputil.ReverseProxy{
		Rewrite:       h.rewrite,
		FlushInterval: -1, // flush every write: streams and SSE must not wait
		ErrorHandler:  h.proxyError,
		BufferPool:    bufferPool{},
	}
	return h
}

type handler struct {
	resolver Resolver
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
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if t.IsEnvd() && routing.BlockedEnvdPath(r.URL.Path) {
		writeError(w, http.StatusNotFound, "404 page not found")
		return
	}
	addr, err := h.resolver.Resolve(r.Context(), t.SandboxID)
	if err != nil {
		if !errors.Is(err, ErrUnknownSandbox) {
			slog.ErrorContext(r.Context(), "resolve sandbox", "sandbox", t.SandboxID, "error", err)
		}
		routing.WriteSandboxNotFound(w, r, t.SandboxID)
		return
	}
	upstream := &url.URL{Scheme: "http", Host: net.JoinHostPort(addr, strconv.Itoa(int(t.Port)))}
	h.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, relayed{t, upstream})))
}

type relayed struct {
	target   routing.Target
	upstream *url.URL
}

// rewrite points the outgoing request at the sandbox's port. The routing
// headers stay (envd ignores them) and the client's X-Access-Token goes
// through for envd to check.
func (h *handler) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(targetKey{}).(relayed)
	pr.SetURL(rt.upstream)
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
}

// proxyError answers a failure to reach the sandbox's port: the sandbox is
// gone or the port has no listener, which e2b's edge reports as 502.
func (h *handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(targetKey{}).(relayed)
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	slog.WarnContext(r.Context(), "relay to sandbox failed", "sandbox", rt.target.SandboxID, "port", rt.target.Port, "error", err)
	writeError(w, http.StatusBadGateway, "the sandbox port "+strconv.Itoa(int(rt.target.Port))+" is not reachable: "+err.Error())
}

func writeError(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"code":` + strconv.Itoa(status) + `,"message":` + strconv.Quote(message) + "}\n"))
}
