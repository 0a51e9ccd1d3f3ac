package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/envd-proxy/internal/fleet"
	"github.com/skiff-dev/skiff/envd-proxy/internal/route"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// nodeToken is what the proxy sends sandboxd.
const nodeToken = "node-token-0123456789abcdef"

// upstream stands in for one node's sandboxd: it counts the connections it
// accepts and records every request it gets before handing it on.
type upstream struct {
	*httptest.Server
	node    string
	accepts atomic.Int64

	mu   sync.Mutex
	seen []*http.Request // clones, bodies not kept
}

func newUpstream(t testing.TB, node string, h http.Handler) *upstream {
	t.Helper()
	u := &upstream{node: node}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Clone(r.Context()))
		u.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	u.Listener = &countingListener{Listener: u.Listener, n: &u.accepts}
	u.EnableHTTP2 = false
	u.Start()
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) endpoint() string { return u.Listener.Addr().String() }

func (u *upstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.seen...)
}

// last returns the last request, failing the test without one.
func (u *upstream) last(t testing.TB) *http.Request {
	t.Helper()
	reqs := u.requests()
	if len(reqs) == 0 {
		t.Fatalf("sandboxd of %s got no request", u.node)
	}
	return reqs[len(reqs)-1]
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// harness is a proxy over a static fleet of stand-in sandboxd hosts.
type harness struct {
	t      testing.TB
	src    *inventory.StaticSource
	index  *fleet.Index
	tokens *route.Tokens
	proxy  *Proxy
	srv    *httptest.Server
	logs   *syncBuffer
	ready  atomic.Bool
}

type harnessOptions struct {
	tokenRoutes int
	// nodeToken is each node's token; nil: nodeToken for every node.
	nodeToken func(node string) string
	quiet     bool // log at info, as in production (benchmarks), not debug
	trusted   []netip.Prefix
}

func newHarness(t testing.TB, opts harnessOptions, ups ...*upstream) *harness {
	t.Helper()
	if opts.tokenRoutes == 0 {
		opts.tokenRoutes = 64
	}
	h := &harness{t: t, src: inventory.NewStaticSource(), logs: &syncBuffer{}}
	h.ready.Store(true)
	for _, u := range ups {
		h.addNode(u.node, u.endpoint())
	}
	h.index = fleet.New(h.src, fleet.Options{})
	h.refresh()
	h.tokens = route.NewTokens(opts.tokenRoutes)
	level := slog.LevelDebug
	if opts.quiet {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: level}))
	if opts.nodeToken == nil {
		opts.nodeToken = func(string) string { return nodeToken }
	}
	h.proxy = New(Config{Fleet: h.index, Tokens: h.tokens, NodeToken: opts.nodeToken, Ready: h.ready.Load, Logger: log, TrustedProxies: opts.trusted})
	h.index.OnGone(h.proxy.NodesGone)
	h.srv = httptest.NewServer(h.proxy)
	t.Cleanup(h.srv.Close)
	return h
}

func (h *harness) addNode(name, endpoint string) {
	h.src.Apply(&v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.NodeInventorySpec{Endpoint: endpoint}})
}

func (h *harness) refresh() {
	h.t.Helper()
	if err := h.index.Refresh(h.t.Context()); err != nil {
		h.t.Fatal(err)
	}
}

// sandbox returns a new sandbox ID on node.
func sandbox(t testing.TB, node string) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(node))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// reply is a response whose body was read and closed.
type reply struct {
	StatusCode int
	Header     http.Header
}

// do sends a request through the proxy and returns the response with its
// body read.
func (h *harness) do(req *http.Request) (reply, string) {
	h.t.Helper()
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("read body: %v", err)
	}
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
}

// request builds a request to the proxy, routed by headers when id is set.
func (h *harness) request(method, path, id string, port string, body io.Reader) *http.Request {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.srv.URL+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", port)
	}
	return req
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ok answers 200 "ok from <node>".
func ok(node string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok from "+node)
	})
}

// waitCounted waits until requests_total{routed_by, code} is want: the
// proxy counts a request when its handler returns, which may be just after
// the client has read the whole answer. The bound only turns a hang into a
// failure.
func (h *harness) waitCounted(by, code string, want float64) {
	h.t.Helper()
	c := h.proxy.metrics.requests.WithLabelValues(by, code)
	for deadline := time.Now().Add(time.Minute); testutil.ToFloat64(c) != want; {
		if time.Now().After(deadline) {
			h.t.Fatalf("requests_total{routed_by=%s,code=%s} = %v, want %v", by, code, testutil.ToFloat64(c), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
