package hostbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/procstat"
	"github.com/skiff-dev/skiff/e2e/internal/system"
)

// LifecycleOptions shape a lifecycle run.
type LifecycleOptions struct {
	// Concurrency lists the levels to run at (1 and 20).
	Concurrency []int
	// Count is how many lifecycles to run at each level.
	Count int
	// Template is the sandboxes' template (base).
	Template string
	// Cmd is what runs in each: commands.run('true') of the SDK runs
	// /bin/bash -l -c true. Empty: nothing runs, each sandbox is created
	// and killed (what the sandbox itself costs).
	Cmd []string
}

// Lifecycle runs o.Count create → run → kill lifecycles at each level of
// concurrency through the e2b API and the proxy, and records the rate, the
// latency of each step, and the CPU each lifecycle cost: the whole host's
// (kernel work included) and each server's.
func Lifecycle(ctx context.Context, sys *system.System, team string, o LifecycleOptions, rec *Recorder, log io.Writer) error {
	c := newClient(sys.APIURL, sys.SandboxURL, sys.Keys[team])
	pids := map[string]int{"sandboxd": sys.PID("sandboxd"), "apiserver": sys.PID("sandbox-apiserver"), "proxy": sys.PID("sandbox-envd-proxy"), "loadgen": os.Getpid()}
	for _, conc := range o.Concurrency {
		var (
			mu                       sync.Mutex
			create, run, kill, total []time.Duration
			failed                   atomic.Int64
			firstErr                 error
		)
		one := func() {
			t0 := time.Now()
			sb, took, err := c.create(ctx, o.Template)
			if err == nil {
				t1 := time.Now()
				if len(o.Cmd) > 0 {
					err = c.run(ctx, sb, o.Cmd[0], o.Cmd[1:]...)
				}
				t2 := time.Now()
				if kerr := c.kill(ctx, sb.id); err == nil {
					err = kerr
				}
				mu.Lock()
				create, run, kill, total = append(create, took), append(run, t2.Sub(t1)), append(kill, time.Since(t2)), append(total, time.Since(t0))
				mu.Unlock()
			}
			if err != nil {
				failed.Add(1)
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		}
		cpu, wall, err := measureCPU(pids, func() { parallel(ctx, o.Count, conc, one) })
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		n := float64(len(total))
		if n == 0 {
			return fmt.Errorf("c=%d: no lifecycle completed: %w", conc, firstErr)
		}
		note := strings.Join(o.Cmd, " ")
		if note == "" {
			note = "(no command)"
		}
		add := func(metric string, v float64, unit string) {
			rec.Add(Result{Bench: "lifecycle", Metric: metric, Value: v, Unit: unit, At: conc, Note: note})
		}
		add("rate", n/wall.Seconds(), "lifecycles/s")
		add("create_p50", percentile(create, 0.5), "ms")
		add("create_p99", percentile(create, 0.99), "ms")
		add("run_p50", percentile(run, 0.5), "ms")
		add("run_p99", percentile(run, 0.99), "ms")
		add("kill_p50", percentile(kill, 0.5), "ms")
		add("lifecycle_p50", percentile(total, 0.5), "ms")
		add("lifecycle_p99", percentile(total, 0.99), "ms")
		for name, s := range cpu {
			add("cpu_ms_"+name, s*1000/n, "ms per lifecycle")
		}
		if f := failed.Load(); f > 0 {
			rec.Add(Result{Bench: "lifecycle", Metric: "failed", Value: float64(f), Unit: "lifecycles", At: conc, Note: firstErr.Error()})
		}
		fmt.Fprintf(log, "lifecycle c=%-3d %4.0f/s in %s (%d failed): create p50 %.1f ms p99 %.1f, run p50 %.1f, kill p50 %.1f; CPU per lifecycle: host %.1f ms (sandboxd %.1f, apiserver %.1f, proxy %.1f, load generator %.1f)\n",
			conc, n/wall.Seconds(), wall.Round(10*time.Millisecond), failed.Load(), percentile(create, 0.5), percentile(create, 0.99), percentile(run, 0.5), percentile(kill, 0.5),
			cpu["host"]*1000/n, cpu["sandboxd"]*1000/n, cpu["apiserver"]*1000/n, cpu["proxy"]*1000/n, cpu["loadgen"]*1000/n)
	}
	return nil
}

// FloorOptions shape a floor run.
type FloorOptions struct {
	// Concurrency lists the levels to run at.
	Concurrency []int
	// Count is how many starts to run at each level.
	Count int
	// Binary is the static binary to run, with Args (busybox's true).
	Binary string
	Args   []string
}

// Floor is the cheapest start this kernel allows, measured as Lifecycle
// is: a bare clone into new user, mount, PID, network, UTS, IPC and
// cgroup namespaces, an exec of a static binary, and its end (the
// namespaces' teardown, in the kernel's workers, counted in the host's
// CPU).
func Floor(ctx context.Context, o FloorOptions, rec *Recorder, log io.Writer) error {
	if _, err := os.Stat(o.Binary); err != nil {
		return fmt.Errorf("the floor's static binary: %w (apt-get install busybox-static)", err)
	}
	for _, conc := range o.Concurrency {
		var (
			mu       sync.Mutex
			lat      []time.Duration
			firstErr error
		)
		one := func() {
			cmd := exec.CommandContext(ctx, o.Binary, o.Args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
					syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWCGROUP,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
			}
			t0 := time.Now()
			err := cmd.Run()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = cmpErr(firstErr, err)
				return
			}
			lat = append(lat, time.Since(t0))
		}
		cpu, wall, err := measureCPU(map[string]int{"loadgen": os.Getpid()}, func() { parallel(ctx, o.Count, conc, one) })
		if err != nil {
			return err
		}
		if firstErr != nil {
			return fmt.Errorf("floor: %w", firstErr)
		}
		n := float64(len(lat))
		add := func(metric string, v float64, unit string) {
			rec.Add(Result{Bench: "floor", Metric: metric, Value: v, Unit: unit, At: conc})
		}
		add("rate", n/wall.Seconds(), "starts/s")
		add("start_p50", percentile(lat, 0.5), "ms")
		add("start_p99", percentile(lat, 0.99), "ms")
		add("cpu_ms_host", cpu["host"]*1000/n, "ms per start")
		fmt.Fprintf(log, "floor     c=%-3d %4.0f/s in %s: start p50 %.2f ms p99 %.2f; CPU per start: host %.2f ms\n",
			conc, n/wall.Seconds(), wall.Round(10*time.Millisecond), percentile(lat, 0.5), percentile(lat, 0.99), cpu["host"]*1000/n)
	}
	return nil
}

// parallel runs f count times, conc at once.
func parallel(ctx context.Context, count, conc int, f func()) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(count) && ctx.Err() == nil {
				f()
			}
		})
	}
	wg.Wait()
}

// measureCPU runs f and returns the CPU seconds each of pids used
// meanwhile (children they waited for included) and the host's, with the
// wall time f took. The host's is read a second after f ends, so that
// work f left to the kernel's workers counts.
func measureCPU(pids map[string]int, f func()) (map[string]float64, time.Duration, error) {
	before := map[string]float64{}
	for name, pid := range pids {
		s, err := procstat.CPUSeconds(pid, true)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", name, err)
		}
		before[name] = s
	}
	host0, err := procstat.HostCPUSeconds()
	if err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	f()
	wall := time.Since(t0)
	out := map[string]float64{}
	for name, pid := range pids {
		s, err := procstat.CPUSeconds(pid, true)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = s - before[name]
	}
	time.Sleep(time.Second)
	host1, err := procstat.HostCPUSeconds()
	if err != nil {
		return nil, 0, err
	}
	out["host"] = host1 - host0
	return out, wall, nil
}
