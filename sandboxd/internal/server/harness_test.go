package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/wire"
)

// The sandboxes' addresses are on loopback (all of 127/8 is), so the fake
// envds and the relay's targets listen at the very address IPAM hands out.
const (
	testCIDR      = "127.213.0.0/24"
	testNodeToken = "node-token-0123456789abcdef"
	testTemplate  = "base"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// fakeEnvd is one sandbox's envd: /health, and /init with its token rule.
type fakeEnvd struct {
	srv  *http.Server
	addr string

	mu       sync.Mutex
	token    string
	env      map[string]string
	user     string
	workdir  string
	inits    int
	unhealth bool // /health answers 503
	rejectIn bool // /init answers 500
}

func startFakeEnvd(t *testing.T, ip netip.Addr, unhealthy bool, token string) *fakeEnvd {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatalf("listen for fake envd: %v", err)
	}
	e := &fakeEnvd{addr: ln.Addr().String(), env: map[string]string{}, unhealth: unhealthy, token: token}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.unhealth {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /init", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.rejectIn {
			http.Error(w, `{"code":500,"message":"broken"}`, http.StatusInternalServerError)
			return
		}
		if e.token != "" && r.Header.Get(wire.AccessTokenHeader) != e.token {
			http.Error(w, `{"code":401,"message":"unauthorized access"}`, http.StatusUnauthorized)
			return
		}
		var in wire.EnvdInit
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := time.Parse(time.RFC3339Nano, in.Timestamp); err != nil {
			http.Error(w, "bad timestamp", http.StatusBadRequest)
			return
		}
		if in.AccessToken != nil {
			e.token = *in.AccessToken
		}
		maps.Copy(e.env, in.EnvVars)
		if in.DefaultUser != "" {
			e.user, e.workdir = in.DefaultUser, in.DefaultWorkdir
		}
		e.inits++
		w.Header().Set("X-Envd-Version", "0.6.4")
		w.WriteHeader(http.StatusNoContent)
	})
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return e
}

func (e *fakeEnvd) close() { _ = e.srv.Close() }

func (e *fakeEnvd) currentToken() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.token
}

// fakeNetwork records namespaces and what was torn down.
type fakeNetwork struct {
	mu       sync.Mutex
	blocks   map[string]ipam.Block
	torn     []string
	setupErr error
}

func newFakeNetwork() *fakeNetwork { return &fakeNetwork{blocks: map[string]ipam.Block{}} }

func (n *fakeNetwork) Setup(_ context.Context, id string, b ipam.Block, _ bool) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.setupErr != nil {
		return "", n.setupErr
	}
	n.blocks[id] = b
	return "/run/netns/" + id, nil
}

func (n *fakeNetwork) Teardown(_ context.Context, id string, _ ipam.Block) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.blocks, id)
	n.torn = append(n.torn, id)
	return nil
}

func (n *fakeNetwork) List() ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.blocks)), nil
}

func (n *fakeNetwork) ResolvConf() []byte { return []byte("nameserver 192.0.2.53\n") }

func (n *fakeNetwork) block(id string) (ipam.Block, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.blocks[id]
	return b, ok
}

func (n *fakeNetwork) has(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.blocks[id]
	return ok
}

func (n *fakeNetwork) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.blocks)
}

// fakeRuntime runs "sandboxes" as fake envds at their addresses.
type fakeRuntime struct {
	t   *testing.T
	net *fakeNetwork

	mu        sync.Mutex
	status    map[string]sandboxrt.Status
	specs     map[string]*sandboxrt.Spec
	envds     map[string]*fakeEnvd // by sandbox ID
	byAddr    map[netip.Addr]*fakeEnvd
	stats     map[string]sandboxrt.Stats
	stopped   []string
	starts    int
	startErr  error
	unhealthy bool // new envds never become healthy
	noEnvd    bool // new sandboxes run no envd at all
	// presetToken is the token new envds hold before any /init.
	presetToken string
}

func newFakeRuntime(t *testing.T, n *fakeNetwork) *fakeRuntime {
	rt := &fakeRuntime{t: t, net: n, status: map[string]sandboxrt.Status{}, specs: map[string]*sandboxrt.Spec{},
		envds: map[string]*fakeEnvd{}, byAddr: map[netip.Addr]*fakeEnvd{}, stats: map[string]sandboxrt.Stats{}}
	t.Cleanup(func() {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		for _, e := range rt.envds {
			e.close()
		}
	})
	return rt
}

func (r *fakeRuntime) Name() string { return "fake" }

func (r *fakeRuntime) Start(_ context.Context, spec *sandboxrt.Spec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts++
	if r.startErr != nil {
		return r.startErr
	}
	b, ok := r.net.block(spec.ID)
	if !ok {
		return errors.New("fake runtime: no network for " + spec.ID)
	}
	if spec.NetNS != "/run/netns/"+spec.ID {
		return errors.New("fake runtime: wrong netns " + spec.NetNS)
	}
	if err := os.WriteFile(spec.Log, nil, 0o600); err != nil {
		return err
	}
	r.status[spec.ID] = sandboxrt.Running
	r.specs[spec.ID] = spec
	if !r.noEnvd {
		e := startFakeEnvd(r.t, b.Sandbox, r.unhealthy, r.presetToken)
		r.envds[spec.ID], r.byAddr[b.Sandbox] = e, e
	}
	return nil
}

func (r *fakeRuntime) Status(_ context.Context, id string) (sandboxrt.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.status[id]
	if !ok {
		return sandboxrt.Stopped, sandboxrt.ErrNotFound
	}
	return st, nil
}

func (r *fakeRuntime) setStatus(id string, st sandboxrt.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status[id] = st
}

func (r *fakeRuntime) Pause(_ context.Context, id string) error {
	return r.transition(id, sandboxrt.Paused)
}

func (r *fakeRuntime) Resume(_ context.Context, id string) error {
	return r.transition(id, sandboxrt.Running)
}

func (r *fakeRuntime) transition(id string, to sandboxrt.Status) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.status[id]; !ok {
		return fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	r.status[id] = to
	return nil
}

func (r *fakeRuntime) Stats(_ context.Context, id string) (sandboxrt.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.stats[id]
	if !ok {
		return sandboxrt.Stats{}, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	return st, nil
}

func (r *fakeRuntime) setStats(id string, st sandboxrt.Stats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats[id] = st
}

func (r *fakeRuntime) Stop(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.status, id)
	if e, ok := r.envds[id]; ok {
		e.close()
		delete(r.envds, id)
	}
	r.stopped = append(r.stopped, id)
	return nil
}

func (r *fakeRuntime) List(_ context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.status)), nil
}

func (r *fakeRuntime) envd(id string) *fakeEnvd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.envds[id]
}

// configure changes the runtime's behaviour for the next starts.
func (r *fakeRuntime) configure(f func(*fakeRuntime)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

func (r *fakeRuntime) spec(id string) *sandboxrt.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.specs[id]
}

func (r *fakeRuntime) startCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

func (r *fakeRuntime) running(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.status[id]
	return ok
}

func (r *fakeRuntime) wasStopped(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.stopped, id)
}

// envdAddr finds the fake envd listening at a block's sandbox address; with
// none, a port nothing listens on.
func (r *fakeRuntime) envdAddr(b ipam.Block) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.byAddr[b.Sandbox]; ok {
		return e.addr
	}
	return net.JoinHostPort(b.Sandbox.String(), "1")
}

// fakeTemplates holds one template, "base", whose rootfs has user "user".
type fakeTemplates struct{ rootfs string }

func newFakeTemplates(t *testing.T) *fakeTemplates {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	return &fakeTemplates{rootfs: dir}
}

func (f *fakeTemplates) Get(name string) (*template.Template, error) {
	if name != testTemplate {
		return nil, fmt.Errorf("template %s: %w", name, os.ErrNotExist)
	}
	return &template.Template{Name: testTemplate, Version: "v1abc", Rootfs: f.rootfs}, nil
}

func (f *fakeTemplates) List() ([]*template.Template, error) {
	t, _ := f.Get(testTemplate)
	return []*template.Template{t}, nil
}

// harness is one sandboxd serving on loopback, with fakes around it.
type harness struct {
	t      *testing.T
	dir    string
	opts   Options
	clock  *clocktesting.FakeClock
	net    *fakeNetwork
	rt     *fakeRuntime
	reg    *registry.Registry
	pool   *ipam.Pool
	srv    *Server
	url    string
	admin  string
	client sandboxdv1connect.SandboxdServiceClient
	stop   func()
}

type harnessConfig struct {
	dir   string
	net   *fakeNetwork
	rt    *fakeRuntime
	clock *clocktesting.FakeClock
	opts  func(*Options)
	// wrap, when set, wraps the fake runtime the server uses.
	wrap func(*fakeRuntime) sandboxrt.Runtime
}

func testOptions() Options {
	o := NewOptions()
	o.Listen, o.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	o.NodeName = "test-node"
	o.MaxSandboxes = 64
	o.CPUCapacity, o.MemoryCapacity = 256_000, 64<<10
	o.SandboxCIDR = testCIDR
	o.Envd = "/nonexistent/envd"
	o.EnvdReadyTimeout = 5 * time.Second
	o.MaxTimeout = 24 * time.Hour
	o.ShutdownTimeout = 50 * time.Millisecond // HTTP/2 clients otherwise hold Shutdown for a second
	return o
}

func newHarness(t *testing.T, cfg harnessConfig) *harness {
	t.Helper()
	if cfg.dir == "" {
		cfg.dir = t.TempDir()
	}
	if cfg.net == nil {
		cfg.net = newFakeNetwork()
	}
	if cfg.rt == nil {
		cfg.rt = newFakeRuntime(t, cfg.net)
	}
	if cfg.clock == nil {
		cfg.clock = clocktesting.NewFakeClock(epoch)
	}
	tokenFile := filepath.Join(cfg.dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testNodeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.AuthTokenFile = tokenFile
	if cfg.opts != nil {
		cfg.opts(&opts)
	}
	if err := opts.Validate(); err != nil {
		t.Fatalf("options: %v", err)
	}
	st, err := store.Open(filepath.Join(cfg.dir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(st, opts.Limits())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := ipam.New(opts.SandboxCIDR)
	if err != nil {
		t.Fatal(err)
	}
	var runtime sandboxrt.Runtime = cfg.rt
	if cfg.wrap != nil {
		runtime = cfg.wrap(cfg.rt)
	}
	srv, err := New(opts, Deps{
		Runtime: runtime, Network: cfg.net, Templates: newFakeTemplates(t), Registry: reg, IPAM: pool,
		LogDir: filepath.Join(cfg.dir, "logs"), Clock: cfg.clock,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		EnvdAddr: cfg.rt.envdAddr, EnvdVersion: "0.6.4",
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, adminLn) }()
	h := &harness{
		t: t, dir: cfg.dir, opts: opts, clock: cfg.clock, net: cfg.net, rt: cfg.rt, reg: reg, pool: pool, srv: srv,
		url: "http://" + ln.Addr().String(), admin: "http://" + adminLn.Addr().String(),
	}
	var once sync.Once
	hc := h2cClient(testNodeToken)
	h.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(h.stop)
	h.client = sandboxdv1connect.NewSandboxdServiceClient(hc, h.url)
	eventually(t, "recovered", srv.recovered.Load)
	return h
}

// h2cClient speaks HTTP/2 without TLS (so streams work as in production)
// and sends token, when set, as a bearer token.
func h2cClient(token string) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	var rt http.RoundTripper = tr
	if token != "" {
		rt = bearer{token: token, next: tr}
	}
	return &http.Client{Transport: rt}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// eventually waits (in real time, generously) for cond: the server's
// deadline actions run on their own goroutines.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func createReq(mod ...func(*pb.CreateRequest)) *connect.Request[pb.CreateRequest] {
	m := &pb.CreateRequest{Template: testTemplate, Timeout: durationpb.New(5 * time.Minute), Team: "team-a"}
	for _, f := range mod {
		f(m)
	}
	return connect.NewRequest(m)
}

func (h *harness) create(mod ...func(*pb.CreateRequest)) *pb.CreateResponse {
	h.t.Helper()
	resp, err := h.client.Create(h.t.Context(), createReq(mod...))
	if err != nil {
		h.t.Fatalf("Create: %v", err)
	}
	return resp.Msg
}

func (h *harness) get(id string) (*pb.Sandbox, error) {
	resp, err := h.client.Get(h.t.Context(), connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetSandbox(), nil
}

func (h *harness) gone(id string) bool {
	_, err := h.get(id)
	return connect.CodeOf(err) == connect.CodeNotFound
}

// wantCode fails unless err has code and, when given, mentions every word.
func wantCode(t *testing.T, err error, code connect.Code, words ...string) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("error = %v, want code %s", err, code)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not mention %q", err, w)
		}
	}
}

// assertNothingHeld fails if any capacity, address or network is still
// held: a failed create must leave nothing behind.
func (h *harness) assertNothingHeld() {
	h.t.Helper()
	if u := h.reg.Usage(); u != (registry.Usage{}) {
		h.t.Fatalf("usage = %+v, want none", u)
	}
	if n := h.net.count(); n != 0 {
		h.t.Fatalf("%d networks left", n)
	}
	if ids, _ := h.rt.List(h.t.Context()); len(ids) != 0 {
		h.t.Fatalf("runtime still runs %v", ids)
	}
	// Every address is free again: the pool hands out all of them.
	for i := range h.pool.Size() {
		if _, err := h.pool.Allocate(fmt.Sprintf("probe-%d", i)); err != nil {
			h.t.Fatalf("address %d still taken: %v", i, err)
		}
	}
	for i := range h.pool.Size() {
		h.pool.Release(fmt.Sprintf("probe-%d", i))
	}
	if logs, _ := os.ReadDir(filepath.Join(h.dir, "logs")); len(logs) != 0 {
		h.t.Fatalf("logs left: %v", logs)
	}
}
