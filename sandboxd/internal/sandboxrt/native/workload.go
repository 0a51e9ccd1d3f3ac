package native

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	skcgroups "github.com/skiff-dev/skiff/shared/cgroups"
)

// envdPids is how many of a sandbox's --pids-limit processes and threads
// its workload cannot take, so that they stay for envd (at most a quarter
// of the limit). envd is the sandbox's init and a Go program: Go's runtime
// ends a program that cannot start a thread it needs, and envd, serving
// requests while a fork bomb held every pid of its sandbox, took the
// sandbox with it. envd runs tens of threads; more only while it serves
// many requests that wait in the kernel at once.
const envdPids = 128

// workloadPids is the pids.max of the workload cgroup of a sandbox whose
// limit is limit.
func workloadPids(limit int64) int64 {
	return limit - min(envdPids, limit/4)
}

// workloadCgroup makes the workload cgroup (skcgroups.Workload, below the
// sandbox's in the pids hierarchy, that envd moves each process it starts
// into: envd's --workload-cgroup-fd) of a sandbox whose cgroups are
// paths (before libcontainer makes the sandbox's own, which it then finds
// made) and opens its cgroup.procs for envd. Where it cannot, the sandbox
// runs without it: its workload may then take every pid of the sandbox,
// envd's too; a warning says so. On cgroup v2 there is none yet (New
// warns): the sandbox's cgroup holds envd, so with pids enabled for its
// children it becomes a thread root, and the workload cgroup would have to
// be made threaded once libcontainer has applied the sandbox's (a domain
// child of a thread root takes no process), which no host here can test.
func (r *Runtime) workloadCgroup(id string, paths map[string]string) *os.File {
	dir, ok := paths["pids"]
	if !ok || r.opts.PidsLimit <= 0 {
		return nil
	}
	f, err := openWorkloadCgroup(dir, workloadPids(r.opts.PidsLimit))
	if err != nil {
		r.opts.Logger.Warn("no pids kept for envd: the sandbox's processes may take them all, and envd's next thread with them", "sandbox", id, "error", err)
		return nil
	}
	return f
}

// openWorkloadCgroup makes the cgroup skcgroups.Workload below the
// sandbox's cgroup dir, in the (v1) pids hierarchy, with pids.max pids and
// opens its cgroup.procs. Only its pids.max is set: every other limit, and
// every count, is the sandbox's, which holds it.
func openWorkloadCgroup(dir string, pids int64) (*os.File, error) {
	work := filepath.Join(dir, skcgroups.Workload)
	if err := os.MkdirAll(work, 0o755); err != nil {
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

// warnWithoutWorkloadCgroups says, when the runtime starts on a cgroup v2
// host, that its sandboxes have no workload cgroup.
func warnWithoutWorkloadCgroups(log *slog.Logger) {
	if cgroups.IsCgroup2UnifiedMode() {
		log.Warn("cgroup v2: a sandbox's processes may take every pid of its --pids-limit, envd's too; the pids kept for envd (a workload cgroup) need cgroup v1 for now")
	}
}
