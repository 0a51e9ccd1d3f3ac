package native

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/shared/cgroups"
)

// cgroupDirs are the directories of the sandboxes' parent cgroup in the
// CPU accounting and memory hierarchies (the same one on cgroup v2),
// found once: a sandbox's cgroup is its ID below each.
type cgroupDirs struct {
	once      sync.Once
	cpu, mem  string
	err       error
	cpuacctV1 bool // cpuacct.usage (v1), else cpu.stat (v2)
}

func (d *cgroupDirs) find(parent string) error {
	d.once.Do(func() {
		if d.cpu, d.err = cgroups.ControllerPath(parent, "cpuacct"); d.err == nil {
			d.cpuacctV1 = true
		} else if errors.Is(d.err, cgroups.ErrNoController) {
			d.cpu, d.err = cgroups.ControllerPath(parent, "cpu")
		}
		if d.err == nil {
			d.mem, d.err = cgroups.ControllerPath(parent, "memory")
		}
	})
	return d.err
}

// usage is what a sandbox's cgroup says it uses: CPU time, memory in use
// (without the inactive file cache, which the kernel can drop at once:
// docker's rule) and its memory limit.
type usage struct {
	cpu         time.Duration
	used, limit int64
}

// cgroupUsage reads a sandbox's usage from a handful of its cgroup's files
// (libcontainer's Stats, by contrast, loads the container's state and
// reads every file of every controller: at a thousand sandboxes sampled
// every 5 s, most of sandboxd's idle CPU).
func (r *Runtime) cgroupUsage(id string) (usage, error) {
	if err := r.cgroups.find(r.opts.CgroupParent); err != nil {
		return usage{}, err
	}
	var u usage
	cpuDir, memDir := filepath.Join(r.cgroups.cpu, id), filepath.Join(r.cgroups.mem, id)
	if r.cgroups.cpuacctV1 {
		ns, err := readInt(filepath.Join(cpuDir, "cpuacct.usage"))
		if err != nil {
			return usage{}, err
		}
		u.cpu = time.Duration(ns)
	} else {
		us, err := statField(filepath.Join(cpuDir, "cpu.stat"), "usage_usec")
		if err != nil {
			return usage{}, err
		}
		u.cpu = time.Duration(us) * time.Microsecond
	}
	current, limit, inactive := "memory.current", "memory.max", "inactive_file"
	if r.cgroups.cpuacctV1 {
		current, limit, inactive = "memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file"
	}
	var err error
	if u.used, err = readInt(filepath.Join(memDir, current)); err != nil {
		return usage{}, err
	}
	if u.limit, err = readInt(filepath.Join(memDir, limit)); err != nil {
		return usage{}, err
	}
	if in, err := statField(filepath.Join(memDir, "memory.stat"), inactive); err == nil && in < u.used {
		u.used -= in
	}
	return u, nil
}

// readInt reads a cgroup file of one number; "max" is the largest.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxInt64, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// statField reads the value of key in a "key value" cgroup file (cpu.stat,
// memory.stat).
func statField(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}
