package hostbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/procstat"
	"github.com/skiff-dev/skiff/e2e/internal/system"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// DensityOptions shape a density run.
type DensityOptions struct {
	// Sandboxes is how many idle sandboxes to start and hold (1,000).
	Sandboxes int
	// Beyond is how many more to try, one at a time, to find the first
	// limit the host hits; 0 skips it.
	Beyond int
	// Concurrency is how many creates run at once within each hundred.
	Concurrency int
	// Template is the sandboxes' template (base).
	Template string
	// Idle is how long the idle CPU of the servers is measured (30 s).
	Idle time.Duration
}

// Density starts o.Sandboxes idle sandboxes through the e2b API of sys
// (team's key), a hundred at a time, and records per hundred the create
// latency (p50, p99) and memory per sandbox; with all running, the memory
// each costs (the PSS of the sandboxes' processes, the host's MemAvailable
// and the sandboxes' cgroups), the idle CPU of sandboxd, the apiserver and
// the proxy; then the first limit past them, and the time to kill them
// all.
func Density(ctx context.Context, sys *system.System, team string, o DensityOptions, rec *Recorder, log io.Writer) error {
	c := newClient(sys.APIURL, sys.SandboxURL, sys.Keys[team])
	sandboxd := sys.PID("sandboxd")
	cg, err := sandboxCgroup(sys.Config().CgroupParent)
	if err != nil {
		return err
	}
	add := func(metric string, v float64, unit string, at int, note string) {
		rec.Add(Result{Bench: "density", Metric: metric, Value: v, Unit: unit, At: at, Note: note})
	}
	time.Sleep(3 * time.Second) // the prepared sandbox and the servers settle
	avail0, err := procstat.MemAvailable()
	if err != nil {
		return err
	}
	pss0, _ := procstat.TotalPSS(procstat.AllPIDs())
	fmt.Fprintf(log, "density: %d sandboxes of %s, %d creates at once; host MemAvailable %d MiB\n", o.Sandboxes, o.Template, o.Concurrency, avail0/mib)

	var (
		mu      sync.Mutex
		ids     []string
		firstNo error
	)
	memSample := func(n int) {
		avail, _ := procstat.MemAvailable()
		pids, _ := procstat.CgroupPIDs(cg)
		pss, _ := procstat.TotalPSS(pids)
		add("host_memory_per_sandbox", float64(avail0-avail)/float64(n)/mib, "MiB", n, "MemAvailable's fall, over the sandboxes")
		add("sandbox_pss_per_sandbox", float64(pss)/float64(n)/mib, "MiB", n, "PSS of the sandboxes' processes, over the sandboxes")
		if m, err := procstat.ReadMemory(sandboxd); err == nil {
			add("sandboxd_pss", float64(m.PSS)/mib, "MiB", n, "")
		}
	}
	start := time.Now()
	for hundred := 0; len(ids) < o.Sandboxes && firstNo == nil; hundred++ {
		batch := min(100, o.Sandboxes-len(ids))
		var lat []time.Duration
		work := make(chan struct{}, batch)
		for range batch {
			work <- struct{}{}
		}
		close(work)
		var wg sync.WaitGroup
		for range o.Concurrency {
			wg.Go(func() {
				for range work {
					if ctx.Err() != nil {
						return
					}
					sb, took, err := c.create(ctx, o.Template)
					mu.Lock()
					if err != nil {
						if firstNo == nil {
							firstNo = err
						}
					} else {
						ids = append(ids, sb.id)
						lat = append(lat, took)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return killAll(context.Background(), c, ids, log)
		}
		n := len(ids)
		add("create_p50", percentile(lat, 0.5), "ms", n, fmt.Sprintf("hundred %d", hundred+1))
		add("create_p99", percentile(lat, 0.99), "ms", n, fmt.Sprintf("hundred %d", hundred+1))
		memSample(n)
		fmt.Fprintf(log, "density: %4d running after %s: create p50 %.1f ms, p99 %.1f ms\n",
			n, time.Since(start).Round(time.Second), percentile(lat, 0.5), percentile(lat, 0.99))
	}
	n := len(ids)
	if firstNo != nil {
		add("first_limit", float64(n), "sandboxes", n, firstNo.Error())
		fmt.Fprintf(log, "density: stopped at %d: %v\n", n, firstNo)
	}
	if n == 0 {
		return fmt.Errorf("no sandbox started: %w", firstNo)
	}

	time.Sleep(10 * time.Second) // let the last ones' start-up end
	memSample(n)
	pss1, _ := procstat.TotalPSS(procstat.AllPIDs())
	add("all_pss_per_sandbox", float64(pss1-pss0)/float64(n)/mib, "MiB", n, "PSS of every process of the host, its growth over the sandboxes")
	if cur, err := cgroupMemory(cg); err == nil {
		add("cgroup_memory_per_sandbox", float64(cur)/float64(n)/mib, "MiB", n, "memory.current of the sandboxes' cgroups (kernel memory charged to them included), over the sandboxes")
	}

	idle, err := idleCPU(sys, o.Idle)
	if err != nil {
		return err
	}
	for name, pct := range idle {
		add("idle_cpu_"+name, pct, "% of a core", n, fmt.Sprintf("over %s", o.Idle))
	}
	fmt.Fprintf(log, "density: idle CPU over %s with %d running: sandboxd %.2f%%, apiserver %.2f%%, proxy %.2f%%, host %.2f%% of a core\n",
		o.Idle, n, idle["sandboxd"], idle["apiserver"], idle["proxy"], idle["host"])

	if firstNo == nil && o.Beyond > 0 {
		limit := "none"
		for range o.Beyond {
			sb, _, err := c.create(ctx, o.Template)
			if err != nil {
				limit = err.Error()
				break
			}
			ids = append(ids, sb.id)
		}
		add("first_limit", float64(len(ids)), "sandboxes", len(ids), limit)
		fmt.Fprintf(log, "density: first limit past %d: at %d: %s\n", n, len(ids), limit)
	}
	return killAll(ctx, c, ids, log, func(took time.Duration) {
		add("kill_all", took.Seconds(), "s", len(ids), "16 kills at once through the API")
	})
}

// killAll kills ids, 16 at a time, and reports how long it took.
func killAll(ctx context.Context, c *client, ids []string, log io.Writer, done ...func(time.Duration)) error {
	start := time.Now()
	work := make(chan string, len(ids))
	for _, id := range ids {
		work <- id
	}
	close(work)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range 16 {
		wg.Go(func() {
			for id := range work {
				if err := c.kill(ctx, id); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	fmt.Fprintf(log, "density: killed %d in %s\n", len(ids), took.Round(10*time.Millisecond))
	for _, f := range done {
		f(took)
	}
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// idleCPU is the CPU each server used over d, and the host's, in percent
// of one core.
func idleCPU(sys *system.System, d time.Duration) (map[string]float64, error) {
	pids := map[string]int{"sandboxd": sys.PID("sandboxd"), "apiserver": sys.PID("sandbox-apiserver"), "proxy": sys.PID("sandbox-envd-proxy")}
	before := map[string]float64{}
	for name, pid := range pids {
		s, err := procstat.CPUSeconds(pid, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		before[name] = s
	}
	host0, err := procstat.HostCPUSeconds()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	time.Sleep(d)
	out := map[string]float64{}
	el := time.Since(t0).Seconds()
	for name, pid := range pids {
		s, err := procstat.CPUSeconds(pid, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = (s - before[name]) / el * 100
	}
	host1, err := procstat.HostCPUSeconds()
	if err != nil {
		return nil, err
	}
	out["host"] = (host1 - host0) / el * 100
	return out, nil
}

// sandboxCgroup is the memory controller's cgroup under which sandboxd
// puts each sandbox's: --cgroup-parent, found as sandboxd finds it (this
// process shares sandboxd's cgroups).
func sandboxCgroup(parent string) (string, error) {
	return cgroups.ControllerPath(parent, "memory") // made with the first sandbox
}

// cgroupMemory is what the cgroup at dir and those below it hold, kernel
// memory charged to them included: memory.current (v2) or
// memory.usage_in_bytes (v1).
func cgroupMemory(dir string) (int64, error) {
	for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	return 0, fmt.Errorf("%s: no memory.current or memory.usage_in_bytes", dir)
}
