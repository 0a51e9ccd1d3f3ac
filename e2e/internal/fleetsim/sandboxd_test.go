package fleetsim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/wire"
)

const testToken = "fleetsim-test-token-0123"

// serve serves sd as a host does and returns its address (host:port).
func serve(t *testing.T, sd *Sandboxd) string {
	t.Helper()
	srv := httptest.NewServer(sd.Handler())
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// eventually polls cond every 10 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A simulated sandboxd, followed by hostinventory's real mirror over a
// real Connect client, yields the inventory a real host's would: every
// sandbox with the host's tag, creates and kills through the API and
// through Start and Remove.
func TestMirrorFollowsSandboxd(t *testing.T) {
	sd := NewSandboxd(SandboxdConfig{NodeName: "sim-007", Token: testToken})
	f := &Fleet{cfg: Config{Lifetime: time.Hour}}
	for i := range 50 {
		if _, err := sd.Start(f.spec("sim-007", []string{"team-a", "team-b"}[i%2], time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	addr := serve(t, sd)
	client := sandboxdapi.NewClients(testToken, nil)(addr)
	mirror := hostinventory.New(client, addr, hostinventory.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = mirror.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	count := func(want int) func() bool {
		return func() bool {
			inv, err := mirror.Inventory()
			return err == nil && len(inv.Spec.Sandboxes) == want
		}
	}
	eventually(t, "the mirror lists 50 sandboxes", count(50))
	inv, err := mirror.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if inv.Name != "sim-007" || inv.Spec.Capacity.Sandboxes != DefaultMaxSandboxes || len(inv.Spec.Templates) != 1 ||
		inv.Spec.Templates[0].Name != BaseTemplate || inv.Spec.Allocated.Sandboxes != 50 {
		t.Errorf("inventory %s: capacity %+v, allocated %+v, templates %+v", inv.Name, inv.Spec.Capacity, inv.Spec.Allocated, inv.Spec.Templates)
	}
	if owned := inventory.Owned(inv); len(owned) != 50 {
		t.Errorf("%d of 50 entries carry the node's tag", len(owned))
	}
	e := inv.Spec.Sandboxes[0]
	if e.Metadata[HostKey] != "sim-007" || e.EnvdVersion != "" || e.EndAt == nil || e.CPUMilli != 500 || e.MemoryMiB != 256 {
		t.Errorf("entry %+v", e)
	}
	b, _ := json.Marshal(e)
	t.Logf("one inventory entry is %d bytes of JSON: %s", len(b), b)

	resp, err := client.Create(ctx, connect.NewRequest(&pb.CreateRequest{
		Template: BaseTemplate, Team: "team-a", Timeout: durationpb.New(time.Minute), Metadata: map[string]string{"k": "v"},
		AllowPublicTraffic: new(false), MaskRequestHost: "x-${PORT}",
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetSandbox().GetId()
	if tag, err := sandboxid.Parse(id); err != nil || tag != sandboxid.NodeTag("sim-007") {
		t.Errorf("ID %q: tag %q, %v", id, tag, err)
	}
	if got, ok := sandboxid.FromAccessToken(resp.Msg.GetEnvdAccessToken()); !ok || got != id {
		t.Errorf("envd token %q is not of %s", resp.Msg.GetEnvdAccessToken(), id)
	}
	if resp.Msg.GetTrafficAccessToken() == "" || resp.Msg.GetSandbox().GetMaskRequestHost() != "x-${PORT}" {
		t.Errorf("private sandbox: traffic token %q, mask %q", resp.Msg.GetTrafficAccessToken(), resp.Msg.GetSandbox().GetMaskRequestHost())
	}
	eventually(t, "the create reaches the mirror", count(51))
	got, err := client.Get(ctx, connect.NewRequest(&pb.GetRequest{SandboxId: id}))
	if err != nil || got.Msg.GetEnvdAccessToken() != resp.Msg.GetEnvdAccessToken() {
		t.Errorf("get %s: %v", id, err)
	}
	list, err := client.List(ctx, connect.NewRequest(&pb.ListRequest{Team: "team-b"}))
	if err != nil || len(list.Msg.GetSandboxes()) != 25 {
		t.Errorf("list team-b: %d sandboxes, %v", len(list.Msg.GetSandboxes()), err)
	}
	if _, err := client.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Kill(ctx, connect.NewRequest(&pb.KillRequest{SandboxId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("second kill: %v, want not_found", err)
	}
	sd.RemoveRandom()
	eventually(t, "the kills reach the mirror", count(49))

	for _, tc := range []struct {
		name string
		req  *pb.CreateRequest
		code connect.Code
	}{
		{"no such template", &pb.CreateRequest{Template: "other", Team: "t", Timeout: durationpb.New(time.Minute)}, connect.CodeNotFound},
		{"no team", &pb.CreateRequest{Template: BaseTemplate, Timeout: durationpb.New(time.Minute)}, connect.CodeInvalidArgument},
		{"no timeout", &pb.CreateRequest{Template: BaseTemplate, Team: "t"}, connect.CodeInvalidArgument},
		{"snapshot", &pb.CreateRequest{Snapshot: "s", Team: "t", Timeout: durationpb.New(time.Minute)}, connect.CodeUnimplemented},
	} {
		if _, err := client.Create(ctx, connect.NewRequest(tc.req)); connect.CodeOf(err) != tc.code {
			t.Errorf("create, %s: %v, want %v", tc.name, err, tc.code)
		}
	}
	if _, err := client.Pause(ctx, connect.NewRequest(&pb.PauseRequest{SandboxId: id})); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("pause: %v, want unimplemented", err)
	}
	wrong := sandboxdapi.NewClients("another-token-0123456", nil)(addr)
	if _, err := wrong.Info(ctx, connect.NewRequest(&pb.InfoRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("info with another token: %v, want unauthenticated", err)
	}
}

// The relay answers envd's /health for a sandbox the host runs, 502 for
// one it does not, and 401 without the node token.
func TestRelay(t *testing.T) {
	sd := NewSandboxd(SandboxdConfig{NodeName: "sim-001", Token: testToken})
	resp, err := sd.Start(Spec{Team: "team-a", EndAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetSandbox().GetId()
	addr := serve(t, sd)
	for _, tc := range []struct {
		name, id, path, token string
		want                  int
	}{
		{"health", id, "/health", testToken, http.StatusNoContent},
		{"unknown sandbox", "abcdefghijklmnop" + string(sandboxid.NodeTag("sim-001")), "/health", testToken, http.StatusBadGateway},
		{"other path", id, "/files", testToken, http.StatusNotImplemented},
		{"no token", id, "/health", "", http.StatusUnauthorized},
		{"bearer is not enough", id, "/health", "bearer", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+tc.path, nil)
			req.Header.Set(wire.SandboxIDHeader, tc.id)
			req.Header.Set(wire.SandboxPortHeader, "49983")
			switch tc.token {
			case "bearer":
				req.Header.Set("Authorization", "Bearer "+testToken)
			case "":
			default:
				req.Header.Set(wire.NodeTokenHeader, tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// A host at its capacity refuses a create as sandboxd does.
func TestFull(t *testing.T) {
	sd := NewSandboxd(SandboxdConfig{NodeName: "sim-002", Token: testToken, MaxSandboxes: 2})
	for range 2 {
		if _, err := sd.Start(Spec{Team: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := sd.Create(t.Context(), connect.NewRequest(&pb.CreateRequest{Template: BaseTemplate, Team: "t", Timeout: durationpb.New(time.Minute)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("create on a full host: %v, want resource_exhausted", err)
	}
}

// A fleet seeds every team on every host, and Churn keeps its size while it
// changes it at about the rate asked.
func TestFleetSeedAndChurn(t *testing.T) {
	opts := publish.NewOptions()
	f, err := New(Config{
		Hosts: 3, SandboxesPerHost: 20, Teams: []string{"a", "b", "c"}, Token: testToken, Publish: opts,
		Identity: func(string) (*rest.Config, error) { return &rest.Config{Host: "https://127.0.0.1:1"}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range f.Hosts() {
		teams := map[string]int{}
		for _, sb := range h.Sandboxd().Sandboxes() {
			teams[sb.GetTeam()]++
		}
		if len(teams) != 3 || h.Sandboxd().Len() != 20 {
			t.Errorf("%s: %d sandboxes, teams %v", h.Name(), h.Sandboxd().Len(), teams)
		}
	}
	// Churn touches running hosts only: mark them running without serving.
	for _, h := range f.Hosts() {
		h.running = &run{}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	st := f.Churn(ctx, 100)
	if n := f.Sandboxes(); n < 59 || n > 61 {
		t.Errorf("%d sandboxes after churn, want 60 ± 1", n)
	}
	if total := st.Created + st.Killed; total < 30 || total > 60 {
		t.Errorf("%d changes in %s at 100/s", total, st.Took)
	}
}

// BenchmarkInventory is what a simulated host's publisher does per publish
// besides the apply: the mirror's NodeInventory of 2,000 sandboxes and its
// conversion for server-side apply, as publish.KubeWriter sends it. At
// 200 hosts under churn (a publish every 2 s each) the simulator does this
// 100 times a second.
func BenchmarkInventory(b *testing.B) {
	sd := NewSandboxd(SandboxdConfig{NodeName: "sim-000", Token: testToken})
	f := &Fleet{cfg: Config{Lifetime: time.Hour}}
	for i := range 2000 {
		if _, err := sd.Start(f.spec("sim-000", fmt.Sprintf("team-%02d", i%20), time.Now())); err != nil {
			b.Fatal(err)
		}
	}
	srv := httptest.NewServer(sd.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	mirror := hostinventory.New(sandboxdapi.NewClients(testToken, nil)(addr), addr, hostinventory.Options{})
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = mirror.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for {
		if inv, err := mirror.Inventory(); err == nil && len(inv.Spec.Sandboxes) == 2000 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var size int
	for b.Loop() {
		inv, err := mirror.Inventory()
		if err != nil {
			b.Fatal(err)
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(inv)
		if err != nil {
			b.Fatal(err)
		}
		data, err := json.Marshal(obj)
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
	}
	b.ReportMetric(float64(size), "bytes/inventory")
}
