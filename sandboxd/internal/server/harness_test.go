package server

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/service"
	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/shared/daemon"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

const testNodeToken = "node-token-0123456789abcdef"

var wantCode = servicetest.WantCode

// harness is one sandboxd serving on loopback, its service on fakes.
type harness struct {
	t      *testing.T
	reg    *registry.Registry
	url    string
	admin  string
	client sandboxdv1connect.SandboxdServiceClient
}

type harnessConfig struct {
	cfg func(*Config)
}

func newHarness(t *testing.T, hc harnessConfig) *harness {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testNodeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Listen: "127.0.0.1:0", Admin: daemon.AdminOptions{Listen: "127.0.0.1:0"}, AuthTokenFile: tokenFile,
		ShutdownTimeout: 50 * time.Millisecond, // HTTP/2 clients otherwise hold Shutdown for a second
	}
	if hc.cfg != nil {
		hc.cfg(&cfg)
	}
	limits := registry.Limits{MaxSandboxes: 64, CPUMilli: 256_000, MemoryMiB: 64 << 10}
	st, err := store.Open(filepath.Join(dir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(st, limits)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := ipam.New(servicetest.CIDR)
	if err != nil {
		t.Fatal(err)
	}
	n := servicetest.NewNetwork()
	rt := servicetest.NewRuntime(t, n)
	log := slog.New(slog.DiscardHandler)
	svc, err := service.New(service.Config{
		NodeName: "test-node", Limits: limits, Envd: "/nonexistent/envd", EnvdReadyTimeout: 5 * time.Second, MaxTimeout: time.Hour,
		DefaultCPUMilli: 1000, DefaultMemoryMiB: 256, MetricsInterval: 5 * time.Second, MetricsSamples: 10,
	}, service.Deps{
		Runtime: rt, Network: n, Templates: servicetest.NewTemplates(t), Registry: reg, IPAM: pool,
		LogDir: filepath.Join(dir, "logs"), Clock: clocktesting.NewFakeClock(servicetest.Epoch), Logger: log,
		EnvdAddr: rt.EnvdAddr, EnvdVersion: servicetest.EnvdVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, svc, log)
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
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	})
	h := &harness{
		t: t, reg: reg, url: "http://" + ln.Addr().String(), admin: "http://" + adminLn.Addr().String(),
		client: sandboxdv1connect.NewSandboxdServiceClient(servicetest.H2CClient(testNodeToken), "http://"+ln.Addr().String()),
	}
	servicetest.Eventually(t, "recovered", func() bool { return svc.Healthy() == nil })
	return h
}

func (h *harness) create() *pb.CreateResponse {
	h.t.Helper()
	resp, err := h.client.Create(h.t.Context(), connect.NewRequest(&pb.CreateRequest{
		Template: servicetest.Template, Timeout: durationpb.New(5 * time.Minute), Team: "team-a",
	}))
	if err != nil {
		h.t.Fatalf("Create: %v", err)
	}
	return resp.Msg
}

func (h *harness) warm(n int) []string {
	h.t.Helper()
	var ids []string
	for range n {
		resp, err := h.client.Warm(h.t.Context(), connect.NewRequest(&pb.WarmRequest{Template: servicetest.Template, Pool: "team-a/warm"}))
		if err != nil {
			h.t.Fatalf("Warm: %v", err)
		}
		ids = append(ids, resp.Msg.GetSandbox().GetId())
	}
	return ids
}
