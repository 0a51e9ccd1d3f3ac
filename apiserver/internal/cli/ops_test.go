package cli

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// standinToken is the node token the tests' sandboxd stand-in accepts.
const standinToken = "node-token-for-the-ops-tests"

// standin stands in for one host's sandboxd, speaking what static mode and
// a create need of its Connect API: Info (held back until release, so a
// test sees the fleet before it synced), Watch (a snapshot, then nothing),
// Claim (every warm sandbox is already taken: failed_precondition, as
// sandboxd answers a lost race), Create (the host is full:
// resource_exhausted), Get and Fork. Everything else is unimplemented.
type standin struct {
	sandboxdv1connect.UnimplementedSandboxdServiceHandler
	node      string
	sandboxes []*pb.Sandbox
	released  chan struct{}
	release   func()
	srv       *httptest.Server
	forked    atomic.Int64 // sandboxes Fork started
}

func newStandin(t *testing.T, node string, sandboxes ...*pb.Sandbox) *standin {
	t.Helper()
	s := &standin{node: node, sandboxes: sandboxes, released: make(chan struct{})}
	s.release = sync.OnceFunc(func() { close(s.released) })
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(s))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+standinToken {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(s.release) // before srv.Close (cleanups run last first): no Info stays blocked
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standin) endpoint() string { return s.srv.Listener.Addr().String() }

// sandboxID is a sandbox ID of this host.
func (s *standin) sandboxID(t *testing.T) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(s.node))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (s *standin) Info(ctx context.Context, _ *connect.Request[pb.InfoRequest]) (*connect.Response[pb.InfoResponse], error) {
	select {
	case <-s.released:
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	return connect.NewResponse(&pb.InfoResponse{
		NodeName: s.node, Tag: string(sandboxid.NodeTag(s.node)), MaxSandboxes: 10,
		Capacity:  &pb.Resources{CpuMilli: 8000, MemoryMib: 8192},
		Templates: []*pb.TemplateVersion{{Name: "base", Version: "v1"}},
	}), nil
}

func (s *standin) Watch(ctx context.Context, _ *connect.Request[pb.WatchRequest], stream *connect.ServerStream[pb.WatchResponse]) error {
	snap := &pb.WatchResponse_Snapshot{Sandboxes: s.sandboxes}
	if err := stream.Send(&pb.WatchResponse{Event: &pb.WatchResponse_Snapshot_{Snapshot: snap}}); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *standin) Claim(context.Context, *connect.Request[pb.ClaimRequest]) (*connect.Response[pb.ClaimResponse], error) {
	return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("sandbox is not warm"))
}

func (s *standin) Create(context.Context, *connect.Request[pb.CreateRequest]) (*connect.Response[pb.CreateResponse], error) {
	return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("no room for the sandbox"))
}

// Get finds one of the sandboxes the host was made with.
func (s *standin) Get(_ context.Context, req *connect.Request[pb.GetRequest]) (*connect.Response[pb.GetResponse], error) {
	for _, sb := range s.sandboxes {
		if sb.GetId() == req.Msg.GetSandboxId() {
			return connect.NewResponse(&pb.GetResponse{Sandbox: sb}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New("no such sandbox"))
}

// Fork starts every fork asked for (each a new running sandbox, which the
// host's Watch never reports) and counts them.
func (s *standin) Fork(_ context.Context, req *connect.Request[pb.ForkRequest]) (*connect.Response[pb.ForkResponse], error) {
	out := &pb.ForkResponse{}
	for range req.Msg.GetCount() {
		id, err := sandboxid.New(sandboxid.NodeTag(s.node))
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		out.Forks = append(out.Forks, &pb.ForkResult{Created: &pb.CreateResponse{Sandbox: &pb.Sandbox{
			Id: id, Template: "base", State: pb.SandboxState_SANDBOX_STATE_RUNNING, Team: req.Msg.GetTeam(),
		}}})
	}
	s.forked.Add(int64(req.Msg.GetCount()))
	return connect.NewResponse(out), nil
}

// serving is serveOn running on loopback listeners.
type serving struct {
	api, admin string
	cancel     context.CancelFunc
	done       chan error
	stopped    bool
	err        error
}

// startServing runs serveOn with o (its listen addresses are not used:
// the listeners are made here) until stop or the end of the test, which
// fails if serveOn then returns an error and stop was not called.
func startServing(t *testing.T, o *serveOptions) *serving {
	t.Helper()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, adminLn := listenLoopback(t), listenLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{api: "http://" + ln.Addr().String(), admin: "http://" + adminLn.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- serveOn(ctx, o, ln, adminLn, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		if !s.stopped {
			if err := s.stop(); err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	})
	return s
}

// stop ends serveOn and returns its error.
func (s *serving) stop() error {
	if !s.stopped {
		s.cancel()
		s.err, s.stopped = <-s.done, true
	}
	return s.err
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// get answers a GET of url: its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// scrape reads the metric families that url (a /metrics) serves.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return mfs
}

// sample returns the value of the sample of family name whose labels are
// exactly labels (a histogram: its count), and whether there is one.
func sample(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// staticOptions are serve's options for static mode over hosts, with a
// keys file holding one key of team-a, which it returns.
func staticOptions(t *testing.T, hosts []string, more ...string) (*serveOptions, string) {
	t.Helper()
	dir := t.TempDir()
	keys, token := filepath.Join(dir, "keys"), filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(standinToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "keys", "create", "--team", "team-a", "--api-keys-file", keys)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--sandboxd", strings.Join(hosts, ","), "--sandboxd-token-file", token, "--api-keys-file", keys,
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	return parseServe(t, append(args, more...)...), strings.TrimSpace(out)
}

// closedAddr is a loopback address nothing listens on: a host that is down.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln := listenLoopback(t)
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Static mode: /healthz answers at once, /readyz only once every --sandboxd
// has been followed once (or has failed: a host that is down does not hold
// the others back), and /metrics counts the e2b API's requests by route
// pattern — never by path — method and status, and creates by outcome,
// whether the fleet decided them or the API refused them first.
func TestStaticModeOperations(t *testing.T) {
	host := newStandin(t, "host-a")
	team, warm := host.sandboxID(t), host.sandboxID(t)
	host.sandboxes = []*pb.Sandbox{
		{Id: team, Template: "base", State: pb.SandboxState_SANDBOX_STATE_RUNNING, Team: "team-a"},
		{Id: warm, Template: "base", State: pb.SandboxState_SANDBOX_STATE_WARM, Pool: "pool/base"},
	}
	// A burst of 2 creates, and a rate that refills none during the test.
	o, key := staticOptions(t, []string{host.endpoint(), closedAddr(t)},
		"--create-rate-per-team", "0.0001", "--create-burst-per-team", "2")
	s := startServing(t, o)

	waitFor(t, "/healthz answers 200", func() bool { code, _ := get(t, s.admin+"/healthz"); return code == http.StatusOK })
	// host-a's Info is held back: the fleet has not synced.
	if code, body := get(t, s.admin+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before host-a answered = %d %q, want 503", code, body)
	}
	host.release()
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })

	a := api{t: t, base: s.api}
	for _, tc := range []struct {
		key, method, path, body string
		want                    int
	}{
		{"", http.MethodGet, "/health", "", http.StatusOK},
		{key, http.MethodGet, "/v2/sandboxes", "", http.StatusOK},
		{key, http.MethodGet, "/v2/sandboxes", "", http.StatusOK},
		{"", http.MethodGet, "/v2/sandboxes", "", http.StatusUnauthorized},
		{key, http.MethodGet, "/sandboxes/" + strings.Repeat("z", 20), "", http.StatusNotFound}, // no such node
		{key, http.MethodGet, "/no/such/route", "", http.StatusNotFound},
		{key, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","timeout":-1}`, http.StatusBadRequest}, // refused by the API
		{key, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`, http.StatusServiceUnavailable},      // claim lost, host full
		{key, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`, http.StatusTooManyRequests},         // the burst is spent
	} {
		if code, body := a.call(tc.key, tc.method, tc.path, tc.body); code != tc.want {
			t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
	}

	mfs := scrape(t, s.admin+"/metrics")
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "GET /health", "method": "GET", "code": "200"}, 1},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "GET /v2/sandboxes", "method": "GET", "code": "200"}, 2},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "GET /v2/sandboxes", "method": "GET", "code": "401"}, 1},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "GET /sandboxes/{id}", "method": "GET", "code": "404"}, 1},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "unmatched", "method": "GET", "code": "404"}, 1},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "POST /v2/sandboxes", "method": "POST", "code": "400"}, 1},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "POST /v2/sandboxes", "method": "POST", "code": "503"}, 1},
		{"skiff_apiserver_http_requests_total", map[string]string{"route": "POST /v2/sandboxes", "method": "POST", "code": "429"}, 1},
		{"skiff_apiserver_http_request_duration_seconds", map[string]string{"route": "POST /v2/sandboxes"}, 3},
		{"skiff_apiserver_http_request_duration_seconds", map[string]string{"route": "GET /v2/sandboxes"}, 3},
		{"skiff_apiserver_creates_total", map[string]string{"outcome": "failed", "reason": "invalid"}, 1},
		{"skiff_apiserver_creates_total", map[string]string{"outcome": "failed", "reason": "capacity"}, 1},
		{"skiff_apiserver_creates_total", map[string]string{"outcome": "failed", "reason": "rate_limited"}, 1},
		{"skiff_apiserver_creates_total", map[string]string{"outcome": "failed", "reason": "other"}, 0},
		{"skiff_apiserver_creates_total", map[string]string{"outcome": "warm", "reason": ""}, 0},
		{"skiff_apiserver_creates_total", map[string]string{"outcome": "cold", "reason": ""}, 0},
		{"skiff_apiserver_warm_claim_conflicts_total", map[string]string{}, 1},
	} {
		if got, ok := sample(mfs, tc.name, tc.labels); !ok || got != tc.want {
			t.Errorf("%s%v = %v (present: %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("/metrics has no %s (the Go and process collectors)", name)
		}
	}
	if _, ok := mfs["skiff_apiserver_api_keys"]; ok {
		t.Error("static mode reports skiff_apiserver_api_keys, which only kube mode counts")
	}
	// No label holds a path's sandbox ID: the route is the pattern.
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "zzzz") || strings.Contains(l.GetValue(), team) {
					t.Errorf("%s has label %s=%q, a sandbox ID", name, l.GetName(), l.GetValue())
				}
			}
		}
	}

	// Profiles only with --enable-pprof.
	if code, _ := get(t, s.admin+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ without --enable-pprof = %d, want 404", code)
	}
}

// --enable-pprof serves Go's profiles on the admin listener, and only
// there.
func TestPprofOnTheAdminListenerOnly(t *testing.T) {
	// The only host is down: the fleet is ready once it has failed.
	o, key := staticOptions(t, []string{closedAddr(t)}, "--enable-pprof")
	s := startServing(t, o)
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1"} {
		if code, body := get(t, s.admin+path); code != http.StatusOK || body == "" {
			t.Errorf("admin GET %s = %d (%d bytes), want 200 with a body", path, code, len(body))
		}
	}
	a := api{t: t, base: s.api}
	if code, body := a.call(key, http.MethodGet, "/debug/pprof/", ""); code != http.StatusNotFound {
		t.Errorf("e2b API GET /debug/pprof/ = %d %s, want 404", code, body)
	}
}

// An --admin-listen that cannot be listened on is an error naming the flag
// and the address, before anything else starts.
func TestServeAdminListenInUse(t *testing.T) {
	taken := listenLoopback(t)
	t.Cleanup(func() { _ = taken.Close() })
	addr := taken.Addr().String()
	_, err := run(t, "serve", "--sandboxd", "127.0.0.1:1", "--sandboxd-token-file", "/no/such/token", "--api-keys-file", "/no/such/keys",
		"--listen", "127.0.0.1:0", "--admin-listen", addr)
	if err == nil || !strings.Contains(err.Error(), "listen on --admin-listen "+addr) {
		t.Fatalf("serve with --admin-listen in use = %v, want it to name the flag and %s", err, addr)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("serve = %v, want address in use underneath", err)
	}
}

// waitFor polls cond; the deadline only turns a hang into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kube mode: the admin listener serves while the informer caches sync;
// /readyz is 503 until they have (here first a user that may list nothing,
// so they never do), then 200; api_keys counts the API-key Secrets.
func TestKubeModeOperations(t *testing.T) {
	env := kubetest.Start(t)
	createNamespaces(t, env.Client, "team-a")
	kc := kubetest.WriteKubeconfig(t, env.Config)
	key, _ := keysCreate(t, kc, "team-a")
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(standinToken), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "no-rbac"}
	s := startServing(t, parseServe(t, "--inventory", "kube", "--kubeconfig", kubetest.WriteKubeconfig(t, cfg), "--sandboxd-token-file", token,
		"--admin-listen", "127.0.0.1:0"))
	waitFor(t, "/healthz answers 200", func() bool { code, _ := get(t, s.admin+"/healthz"); return code == http.StatusOK })
	if code, body := get(t, s.admin+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while the caches cannot sync = %d %q, want 503", code, body)
	}
	if _, ok := scrape(t, s.admin+"/metrics")["go_goroutines"]; !ok {
		t.Error("/metrics before the caches synced has no go_goroutines")
	}
	if err := s.stop(); err == nil || !strings.Contains(err.Error(), "informer cache") {
		t.Errorf("serve stopped while the caches synced = %v, want an error about the caches", err)
	}

	s = startServing(t, parseServe(t, "--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", token, "--admin-listen", "127.0.0.1:0"))
	waitFor(t, "/readyz answers 200", func() bool { code, _ := get(t, s.admin+"/readyz"); return code == http.StatusOK })
	a := api{t: t, base: s.api}
	if code, body := a.call(key, http.MethodGet, "/v2/sandboxes", ""); code != http.StatusOK {
		t.Fatalf("GET /v2/sandboxes = %d %s", code, body)
	}
	mfs := scrape(t, s.admin+"/metrics")
	if got, ok := sample(mfs, "skiff_apiserver_api_keys", map[string]string{}); !ok || got != 1 {
		t.Errorf("skiff_apiserver_api_keys = %v (present: %v), want 1", got, ok)
	}
	labels := map[string]string{"route": "GET /v2/sandboxes", "method": "GET", "code": "200"}
	if got, ok := sample(mfs, "skiff_apiserver_http_requests_total", labels); !ok || got != 1 {
		t.Errorf("skiff_apiserver_http_requests_total%v = %v (present: %v), want 1", labels, got, ok)
	}
}
