// Package servicetest holds the fakes around sandboxd's service for tests:
// a runtime whose "sandboxes" are fake envds listening at the sandboxes'
// own (loopback) addresses, a network that records namespaces, a template
// library of one template, and the clients and waits the tests share.
//
// It depends on nothing of the service, so that the service's own tests
// and those of the packages that serve it can all use it.
package servicetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	"github.com/skiff-dev/skiff/shared/egress"
	"github.com/skiff-dev/skiff/wire"
)

// The sandboxes' addresses are on loopback (all of 127/8 is), so the fake
// envds and the relay's targets listen at the very address IPAM hands out.
const (
	// CIDR is the sandboxes' address pool.
	CIDR = "127.213.0.0/24"
	// Template is the one template Templates holds.
	Template = "base"
	// TemplateVersion is its version.
	TemplateVersion = "v1abc"
	// EnvdVersion is what the fake envds advertise.
	EnvdVersion = "0.6.4"
)

// Epoch is when the tests' fake clocks start.
var Epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// Envd is one sandbox's envd: /health, and /init with its token rule.
type Envd struct {
	srv  *http.Server
	addr string

	mu       sync.Mutex
	state    EnvdState
	unhealth bool // /health answers 503
	rejectIn bool // /init answers 500
}

// EnvdState is what a fake envd was told.
type EnvdState struct {
	// Token is the access token it requires.
	Token   string
	Env     map[string]string
	User    string
	Workdir string
	// Inits counts the /init calls it accepted.
	Inits int
}

func startEnvd(t *testing.T, ip netip.Addr, unhealthy bool, token string) *Envd {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatalf("listen for fake envd: %v", err)
	}
	e := &Envd{addr: ln.Addr().String(), state: EnvdState{Env: map[string]string{}, Token: token}, unhealth: unhealthy}
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
			wire.WriteError(w, http.StatusInternalServerError, "broken")
			return
		}
		if e.state.Token != "" && r.Header.Get(wire.AccessTokenHeader) != e.state.Token {
			wire.WriteError(w, http.StatusUnauthorized, "unauthorized access")
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
			e.state.Token = *in.AccessToken
		}
		maps.Copy(e.state.Env, in.EnvVars)
		if in.DefaultUser != "" {
			e.state.User, e.state.Workdir = in.DefaultUser, in.DefaultWorkdir
		}
		e.state.Inits++
		w.Header().Set("X-Envd-Version", EnvdVersion)
		w.WriteHeader(http.StatusNoContent)
	})
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return e
}

func (e *Envd) close() { _ = e.srv.Close() }

// State returns a copy of what the envd was told.
func (e *Envd) State() EnvdState {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.state
	st.Env = maps.Clone(e.state.Env)
	return st
}

// Token is the access token the envd requires now.
func (e *Envd) Token() string { return e.State().Token }

// RejectInit makes every later /init fail with 500.
func (e *Envd) RejectInit() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rejectIn = true
}

// Network records the namespaces set up and not torn down.
type Network struct {
	mu       sync.Mutex
	blocks   map[string]ipam.Block
	policies map[string]egress.Rules
	setupErr error
}

// NewNetwork returns a network without namespaces.
func NewNetwork() *Network { return &Network{blocks: map[string]ipam.Block{}} }

// Setup records id's namespace, /run/netns/<id>. As the real one, it
// fails when id has a namespace already.
func (n *Network) Setup(_ context.Context, id string, b ipam.Block, _ bool) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.setupErr != nil {
		return "", n.setupErr
	}
	if _, ok := n.blocks[id]; ok {
		return "", fmt.Errorf("create network namespace file for sandbox %s: %w", id, os.ErrExist)
	}
	n.blocks[id] = b
	return "/run/netns/" + id, nil
}

// NSPath is the path Setup returns for id, /run/netns/<id>; nothing is
// there.
func (n *Network) NSPath(id string) string { return "/run/netns/" + id }

// Teardown forgets id's namespace.
func (n *Network) Teardown(_ context.Context, id string, _ ipam.Block) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.blocks, id)
	return nil
}

// List returns the IDs of the namespaces, sorted.
func (n *Network) List() ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.blocks)), nil
}

// ResolvConf names a documentation address.
func (n *Network) ResolvConf() []byte { return []byte("nameserver 192.0.2.53\n") }

// SetPolicy records a sandbox's rules, which Policy returns.
func (n *Network) SetPolicy(id string, _ ipam.Block, _ bool, r egress.Rules) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.policies == nil {
		n.policies = map[string]egress.Rules{}
	}
	n.policies[id] = r
	return nil
}

// Policy returns the rules SetPolicy last gave sandbox id.
func (n *Network) Policy(id string) (egress.Rules, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.policies[id]
	return r, ok
}

// FailSetup makes every later Setup fail with err.
func (n *Network) FailSetup(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.setupErr = err
}

// AddOrphan adds a namespace that no sandbox made.
func (n *Network) AddOrphan(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.blocks[id] = ipam.Block{}
}

func (n *Network) block(id string) (ipam.Block, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.blocks[id]
	return b, ok
}

// Has reports whether id has a namespace.
func (n *Network) Has(id string) bool {
	_, ok := n.block(id)
	return ok
}

// Count is how many namespaces there are.
func (n *Network) Count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.blocks)
}

// RuntimeConfig is how a Runtime's next starts behave.
type RuntimeConfig struct {
	// StartErr fails every start.
	StartErr error
	// Unhealthy: new envds never become healthy.
	Unhealthy bool
	// NoEnvd: new sandboxes run no envd at all.
	NoEnvd bool
	// PresetToken is the token new envds hold before any /init.
	PresetToken string
}

// Runtime runs "sandboxes" as fake envds at their addresses. It implements
// sandboxrt.Runtime; its envds end with the test.
type Runtime struct {
	t   *testing.T
	net *Network

	mu      sync.Mutex
	cfg     RuntimeConfig
	status  map[string]sandboxrt.Status
	specs   map[string]*sandboxrt.Spec
	envds   map[string]*Envd // by sandbox ID
	byAddr  map[netip.Addr]*Envd
	stats   map[string]sandboxrt.Stats
	stopped []string
	starts  int
}

// NewRuntime returns a runtime whose sandboxes use n's namespaces.
func NewRuntime(t *testing.T, n *Network) *Runtime {
	rt := &Runtime{t: t, net: n, status: map[string]sandboxrt.Status{}, specs: map[string]*sandboxrt.Spec{},
		envds: map[string]*Envd{}, byAddr: map[netip.Addr]*Envd{}, stats: map[string]sandboxrt.Stats{}}
	t.Cleanup(func() {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		for _, e := range rt.envds {
			e.close()
		}
	})
	return rt
}

// Name implements sandboxrt.Runtime.
func (r *Runtime) Name() string { return "fake" }

// Start implements sandboxrt.Runtime: it needs the sandbox's namespace,
// creates its log and starts its envd.
func (r *Runtime) Start(_ context.Context, spec *sandboxrt.Spec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts++
	if r.cfg.StartErr != nil {
		return r.cfg.StartErr
	}
	b, ok := r.net.block(spec.ID)
	if !ok {
		return errors.New("fake runtime: no network for " + spec.ID)
	}
	if spec.NetNS != "/run/netns/"+spec.ID {
		return errors.New("fake runtime: wrong netns " + spec.NetNS)
	}
	// The log is opened as the runtimes open it, to append: a sandbox that
	// boots again keeps what it logged before.
	f, err := os.OpenFile(spec.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_ = f.Close()
	r.status[spec.ID] = sandboxrt.Running
	r.specs[spec.ID] = spec
	if !r.cfg.NoEnvd {
		e := startEnvd(r.t, b.Sandbox, r.cfg.Unhealthy, r.cfg.PresetToken)
		r.envds[spec.ID], r.byAddr[b.Sandbox] = e, e
	}
	return nil
}

// Status implements sandboxrt.Runtime.
func (r *Runtime) Status(_ context.Context, id string) (sandboxrt.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.status[id]
	if !ok {
		return sandboxrt.Stopped, sandboxrt.ErrNotFound
	}
	return st, nil
}

// SetStatus changes what Status says of id (Stopped: as if it died, but
// still listed).
func (r *Runtime) SetStatus(id string, st sandboxrt.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status[id] = st
}

// Pause implements sandboxrt.Runtime.
func (r *Runtime) Pause(_ context.Context, id string) error {
	return r.transition(id, sandboxrt.Paused)
}

// Resume implements sandboxrt.Runtime.
func (r *Runtime) Resume(_ context.Context, id string) error {
	return r.transition(id, sandboxrt.Running)
}

func (r *Runtime) transition(id string, to sandboxrt.Status) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.status[id]; !ok {
		return fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	r.status[id] = to
	return nil
}

// Stats implements sandboxrt.Runtime: what SetStats set.
func (r *Runtime) Stats(_ context.Context, id string) (sandboxrt.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.stats[id]
	if !ok {
		return sandboxrt.Stats{}, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	return st, nil
}

// SetStats sets what Stats returns for id.
func (r *Runtime) SetStats(id string, st sandboxrt.Stats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats[id] = st
}

// Stop implements sandboxrt.Runtime.
func (r *Runtime) Stop(_ context.Context, id string) error {
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

// List implements sandboxrt.Runtime.
func (r *Runtime) List(_ context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.status)), nil
}

// Envd is sandbox id's envd, or nil.
func (r *Runtime) Envd(id string) *Envd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.envds[id]
}

// Configure changes the runtime's behaviour for the next starts.
func (r *Runtime) Configure(f func(*RuntimeConfig)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.cfg)
}

// Spec is what sandbox id was started with.
func (r *Runtime) Spec(id string) *sandboxrt.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.specs[id]
}

// StartCount is how many starts were asked for.
func (r *Runtime) StartCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

// Running reports whether the runtime has id (running or paused).
func (r *Runtime) Running(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.status[id]
	return ok
}

// WasStopped reports whether id was ever stopped.
func (r *Runtime) WasStopped(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.stopped, id)
}

// EnvdAddr finds the fake envd listening at a block's sandbox address;
// with none, a port nothing listens on. It stands for the service's
// EnvdAddr, since the fake envds cannot all listen at port 49983.
func (r *Runtime) EnvdAddr(b ipam.Block) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.byAddr[b.Sandbox]; ok {
		return e.addr
	}
	return net.JoinHostPort(b.Sandbox.String(), "1")
}

// Templates holds one template, Template, whose rootfs has user "user".
type Templates struct{ rootfs string }

// NewTemplates makes the template's root filesystem in a temporary
// directory.
func NewTemplates(t *testing.T) *Templates {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	return &Templates{rootfs: dir}
}

// Get returns Template, or an error wrapping fs.ErrNotExist.
func (f *Templates) Get(name string) (*template.Template, error) {
	if name != Template {
		return nil, fmt.Errorf("template %s: %w", name, os.ErrNotExist)
	}
	return &template.Template{Name: Template, Version: TemplateVersion, Rootfs: f.rootfs}, nil
}

// List returns Template.
func (f *Templates) List() ([]*template.Template, error) {
	t, _ := f.Get(Template)
	return []*template.Template{t}, nil
}

// H2CClient speaks HTTP/2 without TLS (so streams work as in production)
// and sends token, when set, as a bearer token.
func H2CClient(token string) *http.Client {
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

// Eventually waits (in real time, generously) for cond: the service's
// deadline actions run on their own goroutines.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// WantCode fails unless err has code and, when given, mentions every word.
func WantCode(t *testing.T, err error, code connect.Code, words ...string) {
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
