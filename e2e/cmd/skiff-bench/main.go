// Command skiff-bench measures one sandbox host through the whole system
// of make up, on demand (make bench-density, make bench-lifecycle; not in
// make test):
//
//	skiff-bench density    start --sandboxes idle sandboxes (1,000) and report
//	                       create p50/p99 per hundred, memory per sandbox,
//	                       idle CPU, the first limit, the time to kill all
//	skiff-bench lifecycle  create → run → kill at each --concurrency, beside
//	                       the floor: a bare clone into new namespaces and
//	                       exec of a static binary
//
// Each prints its progress and a line per result, and appends the results
// as JSON lines to --out, which skiff-plot draws. It starts its own system
// (its own ports, nftables table, cgroup and addresses) and stops it, with
// every sandbox, when done or interrupted. Run as root.
package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/e2e/internal/hostbench"
	"github.com/skiff-dev/skiff/e2e/internal/system"
)

func main() { os.Exit(run()) }

func run() int {
	if len(os.Args) < 2 || (os.Args[1] != "density" && os.Args[1] != "lifecycle") {
		fmt.Fprintln(os.Stderr, "usage: skiff-bench density|lifecycle [flags] (--help lists them)")
		return 2
	}
	mode := os.Args[1]
	fs := pflag.NewFlagSet("skiff-bench "+mode, pflag.ContinueOnError)
	bin := fs.String("bin", os.Getenv("SKIFF_BIN"), "Folder of the binaries make build fills (default $SKIFF_BIN).")
	out := fs.String("out", "", "File the results are appended to, as JSON lines; empty: none.")
	runtimeName := fs.String("runtime", "native", "sandboxd's --runtime: native or gvisor.")
	runsc := fs.String("runsc", "", "With --runtime gvisor: the runsc binary.")
	template := fs.String("template", "base", "The sandboxes' template.")
	sandboxes := fs.Int("sandboxes", 1000, "density: idle sandboxes to start and hold.")
	beyond := fs.Int("beyond", 0, "density: more sandboxes to try past --sandboxes, one at a time, to find the first limit; 0: none.")
	memOver := fs.String("memory-overcommit", "32", "density and lifecycle: sandboxd's --memory-overcommit (make up's is "+system.DefaultMemoryOvercommit+").")
	idle := fs.Duration("idle", 30*time.Second, "density: how long the servers' idle CPU is measured with every sandbox running.")
	conc := fs.String("concurrency", "", "Creates at once: density one number (default 1); lifecycle a list (default 1,20).")
	count := fs.Int("count", 400, "lifecycle: lifecycles (and floor starts) at each concurrency.")
	extra := fs.StringArray("sandboxd-arg", nil, "More flags for sandboxd serve (repeatable), e.g. --sandboxd-arg=--default-disk=0 to measure sandboxes without a disk of their own.")
	cmd := fs.String("cmd", "/bin/bash -l -c true", "lifecycle: the command each runs, split on spaces (the SDK's commands.run('true') runs /bin/bash -l -c true); empty: none, each sandbox is created and killed.")
	if err := fs.Parse(os.Args[2:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "skiff-bench:", err)
		return 2
	}
	levels, err := parseLevels(*conc, mode)
	if err != nil || *bin == "" || *sandboxes < 1 || *beyond < 0 || *count < 1 {
		fmt.Fprintf(os.Stderr, "skiff-bench: bad flags (--bin %q, --concurrency %q: %v)\n", *bin, *conc, err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "skiff-bench: run as root: sandboxd runs sandboxes")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rec := hostbench.NewRecorder(nil)
	if *out != "" {
		f, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "skiff-bench:", err)
			return 1
		}
		defer f.Close()
		rec = hostbench.NewRecorder(f)
	}
	// Not under /root: sandboxes reach their root filesystem through it.
	state, err := os.MkdirTemp("", "skiff-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-bench:", err)
		return 1
	}
	defer func() {
		// The logs stay: they say what refused a sandbox, and where the
		// time went.
		logs, err := os.MkdirTemp("", "skiff-bench-logs-")
		if err == nil {
			err = os.Rename(filepath.Join(state, "logs"), filepath.Join(logs, "logs"))
		}
		if err == nil {
			fmt.Fprintf(os.Stderr, "skiff-bench: the servers' logs are in %s\n", filepath.Join(logs, "logs"))
		}
		_ = os.RemoveAll(state)
	}()
	cfg, err := system.LocalConfig(*bin, state, "bench")
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-bench:", err)
		return 1
	}
	most := *sandboxes + *beyond
	if mode == "lifecycle" {
		most = 0
		for _, l := range levels {
			most = max(most, l)
		}
	}
	// A /30 per sandbox: a /18 holds 4,096.
	cfg.SandboxCIDR = fmt.Sprintf("10.%d.%d.0/18", 100+rand.IntN(100), rand.IntN(4)*64)
	// Each sandbox's pids limit (4096 by default) times the sandboxes
	// must fit in the kernel's pid_max (at most 4,194,304): past 1,023
	// sandboxes, a lower limit each.
	slots := min(4000, most+16)
	cfg.SandboxdArgs = []string{"--max-sandboxes", strconv.Itoa(slots), "--pids-limit", strconv.Itoa(min(4096, (4194304-4096)/slots)), "--enable-pprof"}
	cfg.SandboxdArgs = append(cfg.SandboxdArgs, *extra...)
	cfg.MemoryOvercommit, cfg.Runtime, cfg.RunscPath = *memOver, *runtimeName, *runsc
	cfg.Progress = os.Stderr
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	sys, err := system.Start(startCtx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-bench:", err)
		return 1
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := sys.Stop(stopCtx); err != nil {
			fmt.Fprintln(os.Stderr, "skiff-bench: stop:", err)
		}
	}()

	switch mode {
	case "density":
		err = hostbench.Density(ctx, sys, "bench", hostbench.DensityOptions{
			Sandboxes: *sandboxes, Beyond: *beyond, Concurrency: levels[0], Template: *template, Idle: *idle,
		}, rec, os.Stderr)
	case "lifecycle":
		err = hostbench.Floor(ctx, hostbench.FloorOptions{Concurrency: levels, Count: *count, Binary: "/bin/busybox", Args: []string{"true"}}, rec, os.Stderr)
		if err == nil {
			err = hostbench.Lifecycle(ctx, sys, "bench", hostbench.LifecycleOptions{
				Concurrency: levels, Count: *count, Template: *template, Cmd: strings.Fields(*cmd),
			}, rec, os.Stderr)
		}
	}
	fmt.Println(hostbench.Summary(rec.Results()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-bench:", err)
		return 1
	}
	return 0
}

func parseLevels(s, mode string) ([]int, error) {
	if s == "" {
		if mode == "density" {
			return []int{1}, nil
		}
		return []int{1, 20}, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("concurrency %q: want 1 to 256", f)
		}
		out = append(out, n)
	}
	if mode == "density" && len(out) != 1 {
		return nil, errors.New("density takes one concurrency")
	}
	return out, nil
}
