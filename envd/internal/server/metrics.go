package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/wire"
)

// sandboxMetrics is GET /metrics, in e2b's snake_case JSON.
type sandboxMetrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

// lastCPU is the previous /proc/stat sample: CPU use is measured between two
// calls (since boot on the first).
var lastCPU struct {
	sync.Mutex
	busy, total uint64
}

func metrics(w http.ResponseWriter, _ *http.Request) {
	m, err := readMetrics()
	if err != nil {
		wire.WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}

func readMetrics() (*sandboxMetrics, error) {
	m := &sandboxMetrics{Timestamp: time.Now().Unix(), CPUCount: runtime.NumCPU()}
	busy, total, err := cpuTimes()
	if err != nil {
		return nil, err
	}
	lastCPU.Lock()
	if dt := total - lastCPU.total; dt > 0 && total > lastCPU.total {
		m.CPUUsedPct = float64(busy-lastCPU.busy) / float64(dt) * 100
	}
	lastCPU.busy, lastCPU.total = busy, total
	lastCPU.Unlock()

	mem, err := meminfo()
	if err != nil {
		return nil, err
	}
	m.MemTotal = mem["MemTotal"]
	m.MemCache = mem["Cached"] + mem["Buffers"]
	if avail, ok := mem["MemAvailable"]; ok && avail <= m.MemTotal {
		m.MemUsed = m.MemTotal - avail
	}
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20

	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		return nil, fmt.Errorf("statfs /: %w", err)
	}
	m.DiskTotal = st.Blocks * uint64(st.Bsize)
	m.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	return m, nil
}

// cpuTimes returns busy and total jiffies from the first line of /proc/stat.
func cpuTimes() (busy, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("read /proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("read /proc/stat: %w", err)
		}
		total += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, total, nil
}

// meminfo returns /proc/meminfo in bytes.
func meminfo() (map[string]uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, fmt.Errorf("read /proc/meminfo: %w", err)
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v <<= 10
		}
		out[key] = v
	}
	return out, sc.Err()
}
