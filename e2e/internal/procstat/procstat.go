// Package procstat reads what the benchmarks measure of this machine and
// its processes from /proc and cgroupfs: CPU time, resident and
// proportional memory, the host's available memory and busy CPU time.
package procstat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ClockTicks is the unit of the CPU times in /proc (USER_HZ, 100 on every
// Linux architecture Go runs on).
const ClockTicks = 100

// CPUSeconds is the CPU time process pid has used, user and system; with
// children, also that of its children it has waited for.
func CPUSeconds(pid int, children bool) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command may hold spaces and parentheses: the fields start after
	// the last ')'. utime, stime, cutime and cstime are fields 14 to 17,
	// the 12th to the 15th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	last := 12
	if children {
		last = 14
	}
	var ticks uint64
	for _, s := range f[11 : last+1] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
		}
		ticks += n
	}
	return float64(ticks) / ClockTicks, nil
}

// Memory is what one process holds, in bytes.
type Memory struct {
	// RSS is resident memory now (VmRSS), Peak its high-water mark
	// (VmHWM), PSS the proportional share (Pss of smaps_rollup: shared
	// pages divided among their sharers).
	RSS, Peak, PSS int64
}

// ReadMemory reads process pid's memory.
func ReadMemory(pid int) (Memory, error) {
	status, err := KBFields(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:", "VmHWM:")
	if err != nil {
		return Memory{}, err
	}
	pss, err := PSS(pid)
	if err != nil {
		return Memory{}, err
	}
	return Memory{RSS: status["VmRSS:"], Peak: status["VmHWM:"], PSS: pss}, nil
}

// PSS is process pid's proportional set size in bytes.
func PSS(pid int) (int64, error) {
	rollup, err := KBFields(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:")
	if err != nil {
		return 0, err
	}
	return rollup["Pss:"], nil
}

// MemAvailable is the host's MemAvailable (/proc/meminfo) in bytes.
func MemAvailable() (int64, error) {
	m, err := KBFields("/proc/meminfo", "MemAvailable:")
	return m["MemAvailable:"], err
}

// HostCPUSeconds is the CPU time every CPU of the host has spent busy
// (everything in /proc/stat's cpu line but idle and iowait), in seconds:
// kernel work on no process's behalf (a network namespace's teardown in a
// kworker, say) included.
func HostCPUSeconds() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	var busy uint64
	// user nice system idle iowait irq softirq steal (guest counts in user).
	for i, s := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q", s)
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return float64(busy) / ClockTicks, nil
}

// CgroupPIDs lists every process in the cgroup at dir (a cgroupfs path)
// and the cgroups below it.
func CgroupPIDs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a cgroup removed during the walk
			}
			return err
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil //nolint:nilerr // removed during the walk
		}
		for s := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(s); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// TotalPSS sums the PSS of pids, skipping those that ended; it returns
// how many it read.
func TotalPSS(pids []int) (total int64, n int) {
	for _, pid := range pids {
		if p, err := PSS(pid); err == nil {
			total += p
			n++
		}
	}
	return total, n
}

// AllPIDs lists every process of the host.
func AllPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KBFields reads the "Name: N kB" lines of names from a /proc file, in
// bytes.
func KBFields(path string, names ...string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		for _, n := range names {
			if fields[0] == n {
				kb, err := strconv.ParseInt(fields[1], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%s: %s %q", path, n, fields[1])
				}
				out[n] = kb << 10
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s: no %s", path, n)
		}
	}
	return out, nil
}
