package service

import (
	"testing"

	"connectrpc.com/connect"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

func TestInfo(t *testing.T) {
	h := newHarness(t, harnessConfig{cfg: func(c *Config) { c.Limits.CPUMilli, c.Limits.MemoryMiB = 512_000, 128<<10 }})
	h.create(func(m *pb.CreateRequest) { m.Resources = &pb.Resources{CpuMilli: 500, MemoryMib: 256} })
	h.warm(1)
	resp, err := h.client.Info(t.Context(), connect.NewRequest(&pb.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	m := resp.Msg
	if m.GetNodeName() != "test-node" || m.GetTag() != string(sandboxid.NodeTag("test-node")) || m.GetRuntime() != "fake" ||
		m.GetEnvdVersion() != "0.6.4" || m.GetMaxSandboxes() != 64 || m.GetSandboxes() != 2 {
		t.Fatalf("Info = %v", m)
	}
	if c := m.GetCapacity(); c.GetCpuMilli() != 512_000 || c.GetMemoryMib() != 128<<10 {
		t.Fatalf("capacity = %v, want twice the host (overcommit 2)", c)
	}
	if a := m.GetAllocated(); a.GetCpuMilli() != 2500 || a.GetMemoryMib() != 768 {
		t.Fatalf("allocated = %v", a)
	}
	if m.GetCpuShared() {
		t.Fatal("CPU shared on a host that admits it")
	}
	if len(m.GetTemplates()) != 1 || m.GetTemplates()[0].GetName() != testTemplate || m.GetTemplates()[0].GetVersion() != "v1abc" {
		t.Fatalf("templates = %v", m.GetTemplates())
	}
}

// A host that does not admit CPU says so, and takes sandboxes whose vCPUs
// together are many times its cores.
func TestInfoSharedCPU(t *testing.T) {
	h := newHarness(t, harnessConfig{cfg: func(c *Config) { c.Limits.CPUMilli, c.Limits.CPUShared, c.Limits.MemoryMiB = 2000, true, 128<<10 }})
	for range 5 {
		h.create(func(m *pb.CreateRequest) { m.Resources = &pb.Resources{CpuMilli: 2000, MemoryMib: 256} })
	}
	resp, err := h.client.Info(t.Context(), connect.NewRequest(&pb.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.Msg; !m.GetCpuShared() || m.GetCapacity().GetCpuMilli() != 2000 || m.GetAllocated().GetCpuMilli() != 10_000 || m.GetSandboxes() != 5 {
		t.Fatalf("Info = %v, want shared CPU of 2000m with 10000m of sandboxes", m)
	}
}
