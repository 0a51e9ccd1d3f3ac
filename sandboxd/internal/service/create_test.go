package service

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/service/servicetest"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func TestCreate(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	resp := h.create(func(m *pb.CreateRequest) {
		// e2b's own names are e2b's: a create's variable does not change them.
		m.EnvVars = map[string]string{"FOO": "bar", "E2B_SANDBOX_ID": "mine", "E2B_SANDBOX": "false"}
		m.Metadata = map[string]string{"owner": "alice"}
		m.Resources = &pb.Resources{CpuMilli: 1500, MemoryMib: 1024}
		m.AllowInternetAccess = new(bool)
	})
	sb := resp.GetSandbox()
	if tag, err := sandboxid.Parse(sb.GetId()); err != nil || tag != sandboxid.NodeTag("test-node") {
		t.Fatalf("ID %q: tag %q, %v", sb.GetId(), tag, err)
	}
	if id, ok := sandboxid.FromAccessToken(resp.GetEnvdAccessToken()); !ok || id != sb.GetId() {
		t.Fatalf("token %q, want the sandbox ID, a dot and 64 hex characters", resp.GetEnvdAccessToken())
	}
	if sb.GetState() != pb.SandboxState_SANDBOX_STATE_RUNNING || sb.GetTeam() != "team-a" || sb.GetTemplate() != testTemplate ||
		sb.GetTemplateVersion() != "v1abc" || sb.GetMetadata()["owner"] != "alice" || sb.GetEnvdVersion() != "0.6.4" ||
		sb.GetAllowInternetAccess() {
		t.Fatalf("sandbox = %v", sb)
	}
	if got := sb.GetEndAt().AsTime(); !got.Equal(epoch.Add(5 * time.Minute)) {
		t.Fatalf("endAt = %v, want %v", got, epoch.Add(5*time.Minute))
	}
	if r := sb.GetResources(); r.GetCpuMilli() != 1500 || r.GetMemoryMib() != 1024 || r.GetDiskMib() != 10240 {
		t.Fatalf("resources = %v (disk defaults to 10240)", r)
	}

	e := h.rt.Envd(sb.GetId())
	if e := e.State(); e.Token != resp.GetEnvdAccessToken() || e.Env["FOO"] != "bar" || e.User != "user" || e.Workdir != "/home/user" ||
		e.Env["E2B_SANDBOX_ID"] != sb.GetId() || e.Env["E2B_TEMPLATE_ID"] != testTemplate || e.Env["E2B_SANDBOX"] != "true" {
		t.Errorf("envd got token match %v, env %v, user %q, workdir %q", e.Token == resp.GetEnvdAccessToken(), e.Env, e.User, e.Workdir)
	}

	spec := h.rt.Spec(sb.GetId())
	if spec.CPUMilli != 1500 || spec.MemoryMiB != 1024 || spec.Hostname != "e2b" || spec.Envd != "/nonexistent/envd" ||
		spec.Log != filepath.Join(h.dir, "logs", sb.GetId()+".log") || spec.Rootfs == "" {
		t.Errorf("spec = %+v", spec)
	}
	if string(spec.Files["/etc/resolv.conf"]) != "nameserver 192.0.2.53\n" || !strings.Contains(string(spec.Files["/etc/hosts"]), "127.213.0.2\te2b") ||
		string(spec.Files["/run/e2b/.E2B_SANDBOX"]) != "true" || string(spec.Files["/run/e2b/.E2B_SANDBOX_ID"]) != sb.GetId() ||
		string(spec.Files["/run/e2b/.E2B_TEMPLATE_ID"]) != testTemplate {
		t.Errorf("files = %q", spec.Files)
	}

	rec, err := h.reg.Get(sb.GetId())
	if err != nil || rec.EnvdAccessToken != resp.GetEnvdAccessToken() || rec.Address != "127.213.0.2" || rec.Runtime != "fake" {
		t.Fatalf("record = %+v, %v", rec, err)
	}
	if at, ok := h.svc.deadlines.Deadline(sb.GetId()); !ok || !at.Equal(rec.EndAt) {
		t.Fatalf("deadline = %v %v, want %v", at, ok, rec.EndAt)
	}
	got, err := h.get(sb.GetId())
	if err != nil || got.GetId() != sb.GetId() {
		t.Fatalf("Get = %v, %v", got, err)
	}
}

func TestList(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	a := h.create().GetSandbox().GetId()
	b := h.create(func(m *pb.CreateRequest) { m.Team = "team-b" }).GetSandbox().GetId()
	if _, err := h.client.Pause(t.Context(), connect.NewRequest(&pb.PauseRequest{SandboxId: b})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *pb.ListRequest
		want []string
	}{
		{"all", &pb.ListRequest{}, []string{a, b}},
		{"team", &pb.ListRequest{Team: "team-a"}, []string{a}},
		{"state", &pb.ListRequest{States: []pb.SandboxState{pb.SandboxState_SANDBOX_STATE_PAUSED}}, []string{b}},
		{"team and state", &pb.ListRequest{Team: "team-a", States: []pb.SandboxState{pb.SandboxState_SANDBOX_STATE_PAUSED}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := h.client.List(t.Context(), connect.NewRequest(tc.req))
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sb := range resp.Msg.GetSandboxes() {
				ids = append(ids, sb.GetId())
			}
			if strings.Join(ids, ",") != strings.Join(sortedIDs(tc.want), ",") {
				t.Fatalf("List = %v, want %v", ids, tc.want)
			}
		})
	}
}

func sortedIDs(ids []string) []string {
	out := append([]string(nil), ids...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestCreateValidation(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	long := strings.Repeat("k", 65)
	for _, tc := range []struct {
		name  string
		mod   func(*pb.CreateRequest)
		field string
	}{
		{"no template", func(m *pb.CreateRequest) { m.Template = "" }, "template"},
		{"bad template", func(m *pb.CreateRequest) { m.Template = "Bad/Name" }, "template"},
		{"unknown template", func(m *pb.CreateRequest) { m.Template = "nope" }, "template"},
		{"no timeout", func(m *pb.CreateRequest) { m.Timeout = nil }, "timeout"},
		{"zero timeout", func(m *pb.CreateRequest) { m.Timeout = durationpb.New(0) }, "timeout"},
		{"timeout over max", func(m *pb.CreateRequest) { m.Timeout = durationpb.New(25 * time.Hour) }, "timeout"},
		{"negative cpu", func(m *pb.CreateRequest) { m.Resources = &pb.Resources{CpuMilli: -1} }, "resources.cpu_milli"},
		{"tiny cpu", func(m *pb.CreateRequest) { m.Resources = &pb.Resources{CpuMilli: 5} }, "resources.cpu_milli"},
		{"negative memory", func(m *pb.CreateRequest) { m.Resources = &pb.Resources{MemoryMib: -5} }, "resources.memory_mib"},
		{"tiny memory", func(m *pb.CreateRequest) { m.Resources = &pb.Resources{MemoryMib: 1} }, "resources.memory_mib"},
		{"negative disk", func(m *pb.CreateRequest) { m.Resources = &pb.Resources{DiskMib: -1} }, "resources.disk_mib"},
		{"too much metadata", func(m *pb.CreateRequest) {
			m.Metadata = map[string]string{"a": "", "b": "", "c": "", "d": "", "e": "", "f": "", "g": "", "h": "", "i": ""}
		}, "metadata"},
		{"long metadata key", func(m *pb.CreateRequest) { m.Metadata = map[string]string{long: "v"} }, "metadata"},
		{"big metadata", func(m *pb.CreateRequest) { m.Metadata = map[string]string{"k": strings.Repeat("v", 192)} }, "metadata"},
		{"bad env name", func(m *pb.CreateRequest) { m.EnvVars = map[string]string{"1BAD": "x"} }, "env_vars"},
		{"env with =", func(m *pb.CreateRequest) { m.EnvVars = map[string]string{"A=B": "x"} }, "env_vars"},
		{"env NUL", func(m *pb.CreateRequest) { m.EnvVars = map[string]string{"A": "x\x00y"} }, "env_vars"},
		{"bad team", func(m *pb.CreateRequest) { m.Team = "Team_A" }, "team"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.Create(t.Context(), createReq(tc.mod))
			wantCode(t, err, connect.CodeInvalidArgument, tc.field+":")
		})
	}
	if n := h.rt.StartCount(); n != 0 {
		t.Fatalf("%d starts for invalid requests", n)
	}
	h.assertNothingHeld()

	// Metadata exactly at the bounds is fine.
	h.create(func(m *pb.CreateRequest) {
		m.Metadata = map[string]string{strings.Repeat("k", 64): strings.Repeat("v", 128)}
	})
}

func TestCreateExhausted(t *testing.T) {
	h := newHarness(t, harnessConfig{cfg: func(c *Config) { c.Limits.MaxSandboxes, c.Limits.MemoryMiB = 2, 2048 }})
	first := h.create()
	_, err := h.client.Create(t.Context(), createReq(func(m *pb.CreateRequest) {
		m.Resources = &pb.Resources{MemoryMib: 2000}
	}))
	wantCode(t, err, connect.CodeResourceExhausted, "memory")
	h.create()
	_, err = h.client.Create(t.Context(), createReq())
	wantCode(t, err, connect.CodeResourceExhausted, "sandboxes")
	if n := h.rt.StartCount(); n != 2 {
		t.Fatalf("%d starts, want 2", n)
	}
	// A kill frees the room.
	if _, err := h.client.Kill(t.Context(), connect.NewRequest(&pb.KillRequest{SandboxId: first.GetSandbox().GetId()})); err != nil {
		t.Fatal(err)
	}
	h.create()
}

func TestCreateRollback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(*harness)
		code    connect.Code
	}{
		{"network setup fails", func(h *harness) {
			h.net.FailSetup(errors.New("no veth"))
		}, connect.CodeInternal},
		{"runtime start fails", func(h *harness) {
			h.rt.Configure(func(c *servicetest.RuntimeConfig) { c.StartErr = errors.New("no cgroup") })
		}, connect.CodeInternal},
		{"envd never healthy", func(h *harness) { h.rt.Configure(func(c *servicetest.RuntimeConfig) { c.Unhealthy = true }) }, connect.CodeUnavailable},
		{"envd never listens", func(h *harness) { h.rt.Configure(func(c *servicetest.RuntimeConfig) { c.NoEnvd = true }) }, connect.CodeUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{cfg: func(c *Config) { c.EnvdReadyTimeout = 100 * time.Millisecond }})
			tc.breakIt(h)
			_, err := h.client.Create(t.Context(), createReq())
			wantCode(t, err, tc.code)
			h.assertNothingHeld()
			if n := len(h.reg.List()); n != 0 {
				t.Fatalf("%d records left", n)
			}
		})
	}
}

func TestCreateInitRejectedRollsBack(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	// The envd starts but refuses /init: it holds a token sandboxd does not
	// know.
	h.rt.Configure(func(c *servicetest.RuntimeConfig) { c.PresetToken = "someone-elses" })
	_, err := h.client.Create(t.Context(), createReq())
	wantCode(t, err, connect.CodeUnavailable, "401")
	if strings.Contains(err.Error(), "someone-elses") {
		t.Fatalf("error leaks a token: %v", err)
	}
	h.assertNothingHeld()
}
