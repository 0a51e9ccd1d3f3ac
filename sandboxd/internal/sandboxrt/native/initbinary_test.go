package native_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// With an init binary, a sandbox's init runs from a sealed copy of it, not
// of the test binary, and the sandbox works as before.
func TestInitBinary(t *testing.T) {
	initBin := sandboxtest.InitBinary(t)
	rt, dir := newRuntime(t, func(o *native.Options) { o.InitBinary = initBin })
	// The runtime is the process's: put the default back for the next
	// tests.
	t.Cleanup(func() { newRuntime(t) })
	spec := newSpec(t, dir)
	ctx := context.Background()
	if err := rt.Prepare(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// A prepared sandbox's init waits, before it runs envd, in the
	// sandbox's cgroup.
	pids := cgroupProcs(t, rt.Options().CgroupParent, spec.ID)
	if len(pids) != 1 {
		t.Fatalf("the prepared sandbox's cgroup holds %v, want its init", pids)
	}
	exe, err := os.Readlink("/proc/" + pids[0] + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(exe, "/memfd:") || !strings.Contains(exe, native.InitBinaryName) {
		t.Errorf("the init runs %s, want a sealed copy of %s", exe, initBin)
	}
	if err := rt.StartPrepared(ctx, spec.ID, sandboxrt.Limits{CPUMilli: spec.CPUMilli, MemoryMiB: spec.MemoryMiB, DiskMiB: spec.DiskMiB}); err != nil {
		_ = rt.Stop(ctx, spec.ID)
		t.Fatal(err)
	}
	s := started(t, rt, dir, spec)
	if got := s.run(t, "user", "id -u; grep Seccomp: /proc/self/status"); got.Stdout != "1000\nSeccomp:\t2\n" {
		t.Errorf("in a sandbox started by the init binary: %+v", got)
	}
}

// An init binary of another build, or none at the path, is refused when
// the runtime starts, saying which.
func TestInitBinaryRefused(t *testing.T) {
	sandboxtest.RequireRoot(t)
	other := filepath.Join(t.TempDir(), "sandboxd-init")
	if err := os.WriteFile(other, []byte("#!/bin/sh\necho runc v0.0.1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		other:                            "is of another build (runc v0.0.1)",
		filepath.Join(t.TempDir(), "no"): "no such file",
	} {
		opts := native.DefaultOptions(filepath.Join(sandboxtest.Dir(t), "native"))
		opts.InitBinary = path
		if _, err := native.New(opts); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("init binary %s: %v, want %q", path, err, want)
		}
	}
}

// cgroupProcs lists the processes in the cgroup of sandbox id, under
// parent.
func cgroupProcs(t *testing.T, parent, id string) []string {
	t.Helper()
	dir, err := cgroups.ControllerPath(filepath.Join(parent, id), "pids")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}
