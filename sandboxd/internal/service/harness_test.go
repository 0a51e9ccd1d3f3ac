package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/egressproxy"
	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	"github.com/skiff-dev/skiff/sandboxd/internal/snapshot"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

const testTemplate = servicetest.Template

var (
	epoch      = servicetest.Epoch
	eventually = servicetest.Eventually
	wantCode   = servicetest.WantCode
)

type (
	fakeNetwork = servicetest.Network
	fakeRuntime = servicetest.Runtime
)

// harness is one service served on loopback (h2c, without the server's
// token check), with fakes around it.
type harness struct {
	t      *testing.T
	dir    string
	cfg    Config
	clock  *clocktesting.FakeClock
	net    *fakeNetwork
	rt     *fakeRuntime
	reg    *registry.Registry
	pool   *ipam.Pool
	egress *egressproxy.Sandboxes
	svc    *Service
	url    string
	client sandboxdv1connect.SandboxdServiceClient
	stop   func()
}

type harnessConfig struct {
	dir   string
	net   *fakeNetwork
	rt    *fakeRuntime
	clock *clocktesting.FakeClock
	cfg   func(*Config)
	// wrap, when set, wraps the fake runtime the service uses.
	wrap func(*fakeRuntime) sandboxrt.Runtime
	// snapshots gives the service a snapshot store, in dir.
	snapshots bool
	// stateDir is Deps.StateDir.
	stateDir string
}

func testConfig() Config {
	return Config{
		NodeName:         "test-node",
		Limits:           registry.Limits{MaxSandboxes: 64, CPUMilli: 256_000, MemoryMiB: 64 << 10},
		Envd:             "/nonexistent/envd",
		EnvdReadyTimeout: 5 * time.Second,
		MaxTimeout:       24 * time.Hour,
		DefaultCPUMilli:  2000,
		DefaultMemoryMiB: 512,
		DefaultDiskMiB:   10240,
		MetricsInterval:  5 * time.Second,
		MetricsSamples:   120,
	}
}

func newHarness(t *testing.T, hc harnessConfig) *harness {
	t.Helper()
	if hc.dir == "" {
		hc.dir = t.TempDir()
	}
	if hc.net == nil {
		hc.net = servicetest.NewNetwork()
	}
	if hc.rt == nil {
		hc.rt = servicetest.NewRuntime(t, hc.net)
	}
	if hc.clock == nil {
		hc.clock = clocktesting.NewFakeClock(epoch)
	}
	cfg := testConfig()
	if hc.cfg != nil {
		hc.cfg(&cfg)
	}
	st, err := store.Open(filepath.Join(hc.dir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(st, cfg.Limits)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := ipam.New(servicetest.CIDR)
	if err != nil {
		t.Fatal(err)
	}
	var snaps *snapshot.Store
	if hc.snapshots {
		if snaps, err = snapshot.Open(filepath.Join(hc.dir, "snapshots")); err != nil {
			t.Fatal(err)
		}
	}
	var runtime sandboxrt.Runtime = hc.rt
	if hc.wrap != nil {
		runtime = hc.wrap(hc.rt)
	}
	egressTable := egressproxy.NewSandboxes()
	svc, err := New(cfg, Deps{
		Runtime: runtime, Network: hc.net, Templates: servicetest.NewTemplates(t), Registry: reg, IPAM: pool, Snapshots: snaps, Egress: egressTable,
		LogDir: filepath.Join(hc.dir, "logs"), StateDir: hc.stateDir, Clock: hc.clock,
		Logger:   slog.New(slog.DiscardHandler),
		EnvdAddr: hc.rt.EnvdAddr, EnvdVersion: servicetest.EnvdVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	// As the server does, serve whatever Recover could not re-adopt (a
	// test of that looks at the records).
	if err := svc.Recover(t.Context()); err != nil {
		t.Logf("Recover: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { svc.Run(runCtx); close(ran) }()
	h := &harness{
		t: t, dir: hc.dir, cfg: cfg, clock: hc.clock, net: hc.net, rt: hc.rt, reg: reg, pool: pool, egress: egressTable, svc: svc,
		url: "http://" + ln.Addr().String(),
	}
	var once sync.Once
	// As the server stops it: Watch streams first, then the listener, then
	// the service.
	h.stop = func() {
		once.Do(func() {
			svc.StopWatches()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				_ = srv.Close()
			}
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve: %v", err)
			}
			stopRun()
			<-ran
			svc.Close(ctx)
		})
	}
	t.Cleanup(h.stop)
	h.client = sandboxdv1connect.NewSandboxdServiceClient(servicetest.H2CClient(""), h.url)
	return h
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

// assertNothingHeld fails if any capacity, address or network is still
// held: a failed create must leave nothing behind.
func (h *harness) assertNothingHeld() {
	h.t.Helper()
	if u := h.reg.Usage(); u != (registry.Usage{}) {
		h.t.Fatalf("usage = %+v, want none", u)
	}
	if n := h.net.Count(); n != 0 {
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
