// Command skiff-up runs the whole Skiff system on this machine — sandboxd
// with the base template, sandbox-apiserver in single-host mode and
// sandbox-envd-proxy — prints the E2B_* lines that point an unmodified e2b
// SDK at it, and on Ctrl-C kills its sandboxes and stops it all. A server
// that dies meanwhile is restarted (sandboxd re-adopts its sandboxes), with
// a line on stderr that says so. `make up` builds the binaries and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/system"
)

func main() { os.Exit(run()) }

func run() int {
	cfg := system.Config{Teams: []string{"default"}, NodeName: "local"}
	flag.StringVar(&cfg.Bin, "bin", "bin", "Directory of sandboxd, envd, sandbox-apiserver and sandbox-envd-proxy.")
	flag.StringVar(&cfg.State, "state-dir", "/var/lib/skiff/up", "Where templates, records, the API key and the logs are kept across runs (sandboxes must be able to traverse its parents: not under /root).")
	flag.StringVar(&cfg.RunDir, "run-dir", "/run/skiff-up", "Directory (on a tmpfs) of the sandboxes' network namespaces.")
	flag.StringVar(&cfg.APIListen, "api-listen", "127.0.0.1:3000", "Address of the e2b API (E2B_API_URL).")
	flag.StringVar(&cfg.APIAdmin, "api-admin-listen", "127.0.0.1:3001", "Address of the API's /metrics, /healthz and /readyz.")
	flag.StringVar(&cfg.ProxyListen, "proxy-listen", "127.0.0.1:3002", "Address of the envd proxy (E2B_SANDBOX_URL).")
	flag.StringVar(&cfg.ProxyAdmin, "proxy-admin-listen", "127.0.0.1:3003", "Address of the proxy's /metrics, /healthz and /readyz.")
	flag.StringVar(&cfg.SandboxdListen, "sandboxd-listen", "127.0.0.1:27777", "Address of sandboxd's API and relay.")
	flag.StringVar(&cfg.SandboxdAdmin, "sandboxd-admin-listen", "127.0.0.1:27778", "Address of sandboxd's /metrics and /healthz.")
	flag.StringVar(&cfg.Overcommit, "overcommit", "8", "How far the sandboxes' CPU and memory may exceed the machine's (sandboxd --overcommit).")
	flag.StringVar(&cfg.Runtime, "runtime", "native", "sandboxd's runtime: native or gvisor.")
	flag.StringVar(&cfg.RunscPath, "runsc", "", "With -runtime gvisor: the runsc binary (make runsc builds one).")
	flag.StringVar(&cfg.NFTTable, "nft-table", "skiff_up", "sandboxd's nftables table.")
	flag.StringVar(&cfg.CgroupParent, "cgroup-parent", "skiff-up", "sandboxd's cgroup for the sandboxes.")
	flag.StringVar(&cfg.IfacePrefix, "iface-prefix", "skup", "Start of the host-side names of the sandboxes' veths.")
	flag.StringVar(&cfg.SandboxCIDR, "sandbox-cidr", "10.203.0.0/16", "The sandboxes' address pool.")
	flag.Float64Var(&cfg.CreateRatePerTeam, "create-rate-per-team", system.DefaultCreateRatePerTeam, "Creates per second one team may make (sandbox-apiserver --create-rate-per-team); 0: no limit.")
	flag.IntVar(&cfg.CreateBurstPerTeam, "create-burst-per-team", system.DefaultCreateBurstPerTeam, "Creates one team may make at once above its rate (sandbox-apiserver --create-burst-per-team).")
	flag.IntVar(&cfg.MaxSandboxesPerTeam, "max-sandboxes-per-team", system.DefaultMaxSandboxesPerTeam, "Most sandboxes, running and paused, one team may have (sandbox-apiserver --max-sandboxes-per-team); 0: no limit.")
	flag.Parse()
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sys, err := system.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-up:", err)
		return 1
	}
	fmt.Printf(`
Skiff is up: sandboxd, sandbox-apiserver and sandbox-envd-proxy on this machine (logs in %s).
Point an unmodified e2b SDK at it:

export E2B_API_URL=%s
export E2B_SANDBOX_URL=%s
export E2B_API_KEY=%s

Ctrl-C kills the sandboxes and stops it all; a server that dies before is restarted.
`, sys.LogDir(), sys.APIURL, sys.SandboxURL, sys.Keys["default"])

	code := 0
	<-ctx.Done()
	stop()
	fmt.Fprintln(os.Stderr, "stopping: killing the sandboxes, then the servers...")
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sys.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "skiff-up: stop:", err)
		code = 1
	}
	return code
}
