// Package hostlimits applies the host settings that keep sandboxes,
// together, from taking what the host itself needs, and stops sandboxd from
// starting with a message that says what to change when it cannot.
//
// Processes: every sandbox may have --pids-limit of them (threads count),
// but nothing bounded their sum, and kernel.pid_max is 32768 on many hosts:
// eight sandboxes' thread bombs took every PID, and the host's Go daemons
// (sandboxd among them) died when they could not make a thread. So the
// cgroup above every sandbox's (--cgroup-parent) gets pids.max of the
// host's PIDs and threads (the smaller of kernel.pid_max and
// kernel.threads-max) minus --host-pids-reserve, and kernel.pid_max is
// raised, when it is lower, to what --max-sandboxes sandboxes of
// --pids-limit each and the reserve need together.
package hostlimits

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/skiff-dev/skiff/shared/cgroups"
)

// PidMaxLimit is the largest kernel.pid_max Linux takes on 64-bit hosts
// (PID_MAX_LIMIT).
const PidMaxLimit = 4 << 20

// DefaultPidsReserve is the default of --host-pids-reserve.
const DefaultPidsReserve = 4096

// Options are what the limits derive from.
type Options struct {
	// MaxSandboxes sandboxes of PidsLimit processes each.
	MaxSandboxes int
	PidsLimit    int64
	// PidsReserve is how many processes the host keeps for itself beyond
	// what all sandboxes may hold together.
	PidsReserve int64
	// CgroupParent is the cgroup above every sandbox's, relative as the
	// runtimes take it (shared/cgroups).
	CgroupParent string
	// ProcSys is where the sysctls are: /proc/sys when empty.
	ProcSys string
}

// Applied is what Apply found and set, for sandboxd's start-up line.
type Applied struct {
	// PidMax is kernel.pid_max now; RaisedFrom what it was when Apply
	// raised it, else 0.
	PidMax, RaisedFrom int64
	// ThreadsMax is kernel.threads-max.
	ThreadsMax int64
	// SandboxPids is the pids.max of the sandboxes' parent cgroup: how
	// many processes all sandboxes may have together.
	SandboxPids int64
	// NeighMax is net.ipv4.neigh.default.gc_thresh3 now (0: sandboxd is
	// not in the host's network namespace, where alone it is, and cannot
	// see it); NeighRaisedFrom what it was when Apply raised it, else 0;
	// NeighNeed what the options need.
	NeighMax, NeighRaisedFrom, NeighNeed int64
}

// Apply raises kernel.pid_max when it is below what the options need, and
// bounds the processes of all sandboxes together. Its error says which
// setting or flag to change.
func Apply(o Options) (Applied, error) {
	a, err := checkPidMax(o)
	if err != nil {
		return a, err
	}
	a.NeighNeed = int64(o.MaxSandboxes)*NeighPerSandbox + NeighReserve
	if a.NeighMax, a.NeighRaisedFrom, err = checkNeigh(o); err != nil {
		return a, err
	}
	if err := BoundSandboxPids(o.CgroupParent, a.SandboxPids); err != nil {
		return a, err
	}
	return a, nil
}

// NeighPerSandbox is how many IPv4 neighbour (ARP) entries a sandbox may
// hold in the kernel's one table, which every network namespace shares
// and whose hard bound (gc_thresh3, 1024 by default) the host's own
// interfaces share too: the host's for the sandbox's address on its veth,
// the sandbox's for its gateway, and its loopback's (measured: 2.9 per
// idle sandbox at 1,500), with room. Past the bound the kernel drops
// packets to new neighbours ("neighbor table overflow"): at about 700
// sandboxes with the default, and at 1,508 with 2 per sandbox, a new
// sandbox's envd could not be reached.
const NeighPerSandbox = 4

// NeighReserve is the room in the neighbour table kept for the host's
// own interfaces beyond the sandboxes'.
const NeighReserve = 1024

// checkNeigh raises the kernel's IPv4 neighbour table bounds
// (net.ipv4.neigh.default.gc_thresh3, and gc_thresh2 where entries start
// to be collected eagerly) to what --max-sandboxes needs, if they are
// lower. It returns gc_thresh3 and what it was before, if raised.
func checkNeigh(o Options) (now, from int64, err error) {
	sys := o.ProcSys
	if sys == "" {
		sys = "/proc/sys"
	}
	need := int64(o.MaxSandboxes)*NeighPerSandbox + NeighReserve
	for _, t := range []struct {
		name string
		want int64
	}{
		// gc_thresh3 first: the kernel keeps gc_thresh2 at or below it.
		{"gc_thresh3", need},
		{"gc_thresh2", need - NeighReserve/2},
	} {
		name := "net/ipv4/neigh/default/" + t.name
		cur, err := readSysctl(sys, name)
		if errors.Is(err, os.ErrNotExist) {
			// Only the host's network namespace has the defaults; a
			// sandboxd in another (a test's host) leaves them to the host.
			return 0, 0, nil
		}
		if err != nil {
			return 0, 0, err
		}
		if t.name == "gc_thresh3" {
			now = cur
		}
		if cur >= t.want {
			continue
		}
		if err := os.WriteFile(filepath.Join(sys, name), []byte(strconv.FormatInt(t.want, 10)), 0); err != nil {
			return now, 0, fmt.Errorf("net.ipv4.neigh.default.%s is %d, below the %d neighbour entries that --max-sandboxes %d needs (%d each, and %d for the host), and sandboxd could not raise it (%w): run sysctl -w net.ipv4.neigh.default.%s=%d, or lower --max-sandboxes",
				t.name, cur, t.want, o.MaxSandboxes, NeighPerSandbox, NeighReserve, err, t.name, t.want)
		}
		if t.name == "gc_thresh3" {
			now, from = t.want, cur
		}
	}
	return now, from, nil
}

// checkPidMax raises kernel.pid_max to what the options need, if it is
// lower, and works out the sandboxes' bound.
func checkPidMax(o Options) (Applied, error) {
	sys := o.ProcSys
	if sys == "" {
		sys = "/proc/sys"
	}
	need := int64(o.MaxSandboxes)*o.PidsLimit + o.PidsReserve
	if need > PidMaxLimit {
		return Applied{}, fmt.Errorf("--max-sandboxes %d × --pids-limit %d + --host-pids-reserve %d = %d processes, more than Linux allows on a host (kernel.pid_max at most %d): lower them",
			o.MaxSandboxes, o.PidsLimit, o.PidsReserve, need, PidMaxLimit)
	}
	pidMax, err := readSysctl(sys, "kernel/pid_max")
	if err != nil {
		return Applied{}, err
	}
	a := Applied{PidMax: pidMax}
	if pidMax < need {
		if err := os.WriteFile(filepath.Join(sys, "kernel/pid_max"), []byte(strconv.FormatInt(need, 10)), 0); err != nil {
			return a, fmt.Errorf("kernel.pid_max is %d, below the %d processes that --max-sandboxes %d × --pids-limit %d + --host-pids-reserve %d need, and sandboxd could not raise it (%w): run sysctl -w kernel.pid_max=%d, or lower the flags",
				pidMax, need, o.MaxSandboxes, o.PidsLimit, o.PidsReserve, err, need)
		}
		if a.PidMax, err = readSysctl(sys, "kernel/pid_max"); err != nil {
			return a, err
		}
		a.RaisedFrom = pidMax
	}
	if a.ThreadsMax, err = readSysctl(sys, "kernel/threads-max"); err != nil {
		return a, err
	}
	a.SandboxPids = min(a.PidMax, a.ThreadsMax) - o.PidsReserve
	if a.SandboxPids < o.PidsLimit {
		return a, fmt.Errorf("kernel.pid_max %d and kernel.threads-max %d leave %d processes for sandboxes after --host-pids-reserve %d, fewer than one sandbox's --pids-limit %d",
			a.PidMax, a.ThreadsMax, a.SandboxPids, o.PidsReserve, o.PidsLimit)
	}
	return a, nil
}

// BoundSandboxPids sets pids.max of the cgroup parent, above every
// sandbox's cgroup, to n, making the cgroup when it is not there yet.
func BoundSandboxPids(parent string, n int64) error {
	dir, err := cgroups.ControllerPath(parent, "pids")
	if err != nil {
		return fmt.Errorf("bound the processes of all sandboxes: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bound the processes of all sandboxes: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(n, 10)), 0); err != nil {
		return fmt.Errorf("bound the processes of all sandboxes: %w", err)
	}
	return nil
}

func readSysctl(sys, name string) (int64, error) {
	data, err := os.ReadFile(filepath.Join(sys, name))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	if n <= 0 {
		return 0, errors.New("read " + strings.ReplaceAll(name, "/", ".") + ": not positive")
	}
	return n, nil
}
