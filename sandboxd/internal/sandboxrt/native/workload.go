package native

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// envdPids is how many of a sandbox's --pids-limit processes and threads
// its workload cannot take, so that they stay for envd (at most a quarter
// of the limit). envd is the sandbox's init and a Go program: Go's runtime
// ends a program that cannot start a thread it needs, and envd, serving
// requests while a fork bomb held every pid of its sandbox, took the
// sandbox with it. envd runs tens of threads; more only while it serves
// many requests that wait in the kernel at once.
const envdPids = 128

// workloadCgroupName is the cgroup, below a sandbox's in the pids
// hierarchy, that envd moves each process it starts into, before the
// process runs (envd's --workload-cgroup-fd). Only its pids.max is set:
// every other limit, and every count, is the sandbox's, which holds it.
const workloadCgroupName = "workload"

// workloadPids is the pids.max of the workload cgroup of a sandbox whose
// limit is limit.
func workloadPids(limit int64) int64 {
	return limit - min(envdPids, limit/4)
}

// workloadCgroup makes the workload cgroup of a sandbox whose cgroups are
// paths (before libcontainer makes the sandbox's own, which it then finds
// made) and opens its cgroup.procs for envd. Where it cannot, the sandbox
// runs without it, as before: its workload may then take every pid of the
// sandbox, envd's too; a warning says so.
func (r *Runtime) workloadCgroup(id string, paths map[string]string) *os.File {
	dir, ok := paths["pids"]
	if !ok {
		dir, ok = paths[""] // cgroup v2: one hierarchy
	}
	if !ok {
		return nil
	}
	f, err := openWorkloadCgroup(dir, workloadPids(r.opts.PidsLimit), cgroups.IsCgroup2UnifiedMode())
	if err != nil {
		r.opts.Logger.Warn("no pids kept for envd: the sandbox's processes may take them all, and envd's next thread with them", "sandbox", id, "error", err)
		return nil
	}
	return f
}

// openWorkloadCgroup makes the cgroup workloadCgroupName below the
// sandbox's cgroup dir with pids.max pids and opens its cgroup.procs. On
// cgroup v2 the pids controller is enabled for the children of dir and of
// its parent: pids is a threaded controller, so dir may hold envd itself
// and still limit its child.
func openWorkloadCgroup(dir string, pids int64, v2 bool) (*os.File, error) {
	if v2 {
		if err := os.WriteFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
			return nil, fmt.Errorf("enable the pids controller below %s: %w", filepath.Dir(dir), err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make cgroup %s: %w", dir, err)
	}
	if v2 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
			return nil, fmt.Errorf("enable the pids controller below %s: %w", dir, err)
		}
	}
	work := filepath.Join(dir, workloadCgroupName)
	if err := os.Mkdir(work, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("make cgroup %s: %w", work, err)
	}
	if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte(strconv.FormatInt(pids, 10)), 0); err != nil {
		return nil, fmt.Errorf("limit cgroup %s: %w", work, err)
	}
	f, err := os.OpenFile(filepath.Join(work, "cgroup.procs"), os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", work, err)
	}
	return f, nil
}
