package native_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// A sandbox's memory limit bounds its swap too: on a host with swap, a
// process past the limit is killed as on a host without, not swapped out
// (where it would fill the host's swap for every tenant). The same holds
// for a prepared sandbox started with other limits than it was made with.
func TestSwapIsLimited(t *testing.T) {
	rt, dir := newRuntime(t)
	ctx := context.Background()
	s := start(t, rt, dir, func(sp *sandboxrt.Spec) { sp.MemoryMiB = 64 })
	spec := newSpec(t, dir)
	spec.MemoryMiB = 256
	if err := rt.Prepare(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := rt.StartPrepared(ctx, spec.ID, sandboxrt.Limits{CPUMilli: spec.CPUMilli, MemoryMiB: 96, DiskMiB: spec.DiskMiB}); err != nil {
		_ = rt.Stop(ctx, spec.ID)
		t.Fatal(err)
	}
	prepared := started(t, rt, dir, spec)
	sandboxes := []struct {
		*sandbox
		limit int64
	}{{s, 64 << 20}, {prepared, 96 << 20}}
	for _, c := range sandboxes {
		mem, err := cgroups.ControllerPath(filepath.Join(rt.Options().CgroupParent, c.spec.ID), "memory")
		if err != nil {
			t.Fatal(err)
		}
		// cgroup v1 limits memory and swap together, v2 swap alone.
		want := map[string]int64{"memory.limit_in_bytes": c.limit, "memory.memsw.limit_in_bytes": c.limit}
		if _, err := os.Stat(filepath.Join(mem, "memory.max")); err == nil {
			want = map[string]int64{"memory.max": c.limit, "memory.swap.max": 0}
		}
		for file, want := range want {
			if got, err := os.ReadFile(filepath.Join(mem, file)); err != nil || strings.TrimSpace(string(got)) != strconv.FormatInt(want, 10) {
				t.Errorf("%s of a sandbox of %d MiB = %q (%v), want %d", file, c.limit>>20, got, err, want)
			}
		}
	}
	sandboxtest.Swap(t, 256<<20)
	for _, c := range sandboxes {
		if got := c.run(t, "user", "head -c 160m /dev/zero | tail > /dev/null; echo exit=$?"); !strings.Contains(got.Stdout, "exit=137") {
			t.Errorf("a process of 160 MiB in a sandbox of %d MiB, on a host with 256 MiB of swap: %+v, want it killed", c.limit>>20, got)
		}
	}
}
