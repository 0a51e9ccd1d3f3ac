// Package fleetbench measures Skiff's control plane at fleet scale on one
// machine (issue 21): a real etcd and kube-apiserver with the aggregator
// (shared/testing/kubetest), a fleet of simulated hosts (package fleetsim)
// each publishing a real NodeInventory on the real cadence, and the real
// sandbox-apiserver and sandbox-envd-proxy binaries reading it, as in
// production (--inventory kube, the aggregated API behind its APIService).
//
// Run starts all of it, waits until the apiserver lists every sandbox,
// then measures three phases:
//
//   - steady: nothing changes; the hosts publish every interval.
//   - churn: a fraction of all sandboxes changes every second (creates and
//     kills on random hosts, made on the simulated hosts themselves), and
//     sandboxes are created and deleted through the e2b API to time
//     placement.
//   - death: one host dies as a kill -9 would; how long until its
//     sandboxes leave the e2b list, the aggregated (kubectl) list and the
//     proxy's routing.
//
// In steady and churn it reads etcd's own counters (its /metrics), the
// CPU and memory of etcd, kube-apiserver, sandbox-apiserver,
// sandbox-envd-proxy and this process (/proc), and times the readers'
// requests, probed at a fixed rate throughout (an e2b list page 4 times a
// second, a kubectl list page once a second, a request through the proxy
// 10 times a second). Everything it starts is stopped when the testing.TB
// ends (e2e/internal/harness gives a command one).
package fleetbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/deploy"
	"github.com/skiff-dev/skiff/e2e/internal/fleetenv"
	"github.com/skiff-dev/skiff/e2e/internal/fleetsim"
	"github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// bench is one run.
type bench struct {
	tb       testing.TB
	ctx      context.Context
	o        *Options
	progress io.Writer
	start    time.Time
	logs     string
	bins     string

	env   *kubetest.Env
	admin client.Client
	dyn   dynamic.Interface
	http  *http.Client
	// token is the node token every host accepts.
	token string
	// team is the team whose e2b list and creates are timed; key its key.
	team, key        string
	apiURL, proxyURL string
	procs            []proc
	// admins are the readers' admin addresses (their /debug/pprof/ with
	// --profile-dir), by program.
	admins map[string]string

	fleet  *fleetsim.Fleet
	writes *fleetsim.Writes
	rep    *Report
}

// proc is a measured process.
type proc struct {
	name string
	pid  int
}

// Run runs the whole measurement (see the package comment) within
// o.Timeout, writing what it is doing to progress, and returns the
// results. It fails tb when the control plane or the readers cannot
// start; it returns an error when a phase cannot be measured (the
// apiserver never lists every sandbox, a dead host never leaves).
func Run(tb testing.TB, o *Options, progress io.Writer) (*Report, error) {
	tb.Helper()
	bins, err := filepath.Abs(o.Bin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(tb.Context(), o.Timeout)
	defer cancel()
	b := &bench{tb: tb, ctx: ctx, o: o, progress: progress, start: time.Now(), logs: o.LogDir, bins: bins,
		http: &http.Client{Timeout: 30 * time.Second}, writes: &fleetsim.Writes{},
		token: fmt.Sprintf("fleetsim-node-token-%d", time.Now().UnixNano())}
	if b.logs == "" {
		if b.logs, err = os.MkdirTemp("", "skiff-fleetsim-logs-"); err != nil {
			return nil, err
		}
	}
	total := o.Hosts * o.SandboxesPerHost
	b.rep = &Report{LogDir: b.logs, head: Result{
		Time: b.start.UTC().Truncate(time.Second), Hosts: o.Hosts, SandboxesPerHost: o.SandboxesPerHost, Sandboxes: total,
		Teams: o.Teams, IntervalSeconds: o.Interval.Seconds(), WindowSeconds: o.window().Seconds(), Churn: o.Churn,
		Shards: o.Shards, ShardFormat: o.ShardFormat, MaxChanges: o.MaxChanges,
	}}
	b.say("%d hosts × %d sandboxes in %d %s shards each, up to %d changes carried, %d teams; interval %s, window %s; logs in %s", o.Hosts, o.SandboxesPerHost, o.Shards, o.ShardFormat, o.MaxChanges, o.Teams, o.Interval, o.window(), b.logs)
	b.controlPlane()
	b.readers()
	b.startFleet()
	if err := b.waitListed(total); err != nil {
		return b.rep, err
	}
	if err := b.measure(PhaseSteady, nil); err != nil {
		return b.rep, err
	}
	if err := b.measure(PhaseChurn, b.churn); err != nil {
		return b.rep, err
	}
	if err := b.death(); err != nil {
		return b.rep, err
	}
	b.say("done in %s", time.Since(b.start).Round(time.Second))
	return b.rep, nil
}

// say prints a progress line.
func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.progress, "fleetsim %6.1fs: %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

func (b *bench) must(err error) {
	b.tb.Helper()
	if err != nil {
		b.tb.Fatal(err)
	}
}

// controlPlane starts etcd and kube-apiserver with the aggregator, and
// makes the teams' namespaces and the base template.
func (b *bench) controlPlane() {
	tb := b.tb
	b.env = kubetest.StartWith(tb, kubetest.Options{Aggregator: true, LogDir: b.logs})
	scheme := deploy.NewScheme()
	b.must(v1beta1.AddToScheme(scheme))
	var err error
	b.admin, err = client.New(b.env.Config, client.Options{Scheme: scheme})
	b.must(err)
	// The probes' and the death phase's requests must not queue behind
	// client-go's default rate limit.
	cfg := *b.env.Config
	cfg.QPS, cfg.Burst = 1000, 1000
	b.dyn = dynamic.NewForConfigOrDie(&cfg)
	for i := range b.o.Teams {
		b.must(b.admin.Create(b.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamName(i)}}))
	}
	b.team = teamName(0)
	b.must(b.admin.Create(b.ctx, &v1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: fleetsim.BaseTemplate},
		Spec:       v1beta1.SandboxTemplateSpec{Source: v1beta1.TemplateSource{Builtin: "base"}, CPUMilli: 500, MemoryMiB: 256},
	}))
	etcd, api, err := b.env.PIDs()
	b.must(err)
	b.procs = append(b.procs, proc{"etcd", etcd}, proc{"kube-apiserver", api})
	b.say("control plane up: etcd %s, kube-apiserver %s", b.env.EtcdURL().Host, b.env.Config.Host)
}

func teamName(i int) string { return fmt.Sprintf("team-%02d", i) }

// readers starts sandbox-apiserver (its aggregated API behind the
// APIService on loopback: deploy.InstallLocal) and sandbox-envd-proxy,
// both with --inventory kube, and makes the timed team's API key.
func (b *bench) readers() {
	tb := b.tb
	_, portStr, _ := strings.Cut(hosttest.FreeAddr(tb), ":")
	port, _ := strconv.Atoi(portStr)
	serving, err := deploy.InstallLocal(b.ctx, b.admin, tb.TempDir(), port)
	b.must(err)
	sa := fleetenv.ServiceAccountKubeconfig(tb, b.env)
	kc := b.env.Kubeconfig(tb)
	b.key = fleetenv.APIKey(tb, b.bins, kc, b.team)
	tokenFile := filepath.Join(tb.TempDir(), "node-token")
	b.must(os.WriteFile(tokenFile, []byte(b.token), 0o600))
	fresh := fleetenv.FreshnessFlags(b.o.Interval, b.o.window())

	api, apiAdmin := hosttest.FreeAddr(tb), hosttest.FreeAddr(tb)
	b.apiURL = "http://" + api
	args := append([]string{"serve", "--listen", api, "--admin-listen", apiAdmin, "--inventory", "kube", "--kubeconfig", sa,
		"--sandboxd-token-file", tokenFile, "--log-format", "text",
		// A per-team quota an operator of thousands of sandboxes per team
		// would set (a create then counts the team's sandboxes, as with
		// the default), and no create rate: the creates are timed, not
		// throttled.
		"--max-sandboxes-per-team", "1000000", "--create-rate-per-team", "0"}, serving...)
	b.daemon("sandbox-apiserver", api, append(append(args, fresh...), b.pprofFlags("sandbox-apiserver", apiAdmin)...)...)

	proxyAddr, proxyAdmin := hosttest.FreeAddr(tb), hosttest.FreeAddr(tb)
	b.proxyURL = "http://" + proxyAddr
	b.daemon("sandbox-envd-proxy", proxyAddr, append([]string{"serve", "--listen", proxyAddr, "--admin-listen", proxyAdmin,
		"--inventory", "kube", "--kubeconfig", kc, "--sandboxd-token-file", tokenFile, "--log-format", "text"},
		append(fresh, b.pprofFlags("sandbox-envd-proxy", proxyAdmin)...)...)...)

	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	b.must(deploy.WaitAvailable(ctx, b.admin))
	b.say("sandbox-apiserver at %s (its APIService Available), sandbox-envd-proxy at %s", b.apiURL, b.proxyURL)
}

// pprofFlags are program's flags to serve profiles on admin, with
// --profile-dir (none without).
func (b *bench) pprofFlags(program, admin string) []string {
	if b.o.ProfileDir == "" {
		return nil
	}
	if b.admins == nil {
		b.admins = map[string]string{}
	}
	b.admins[program] = admin
	return []string{"--enable-pprof"}
}

// daemon starts program of --bin as a daemon logging to the run's folder
// (hosttest's Daemon: it dies with this process even when that cannot
// clean up), and records its PID (found by listen, one of its arguments).
func (b *bench) daemon(program, listen string, args ...string) {
	d := hosttest.NewDaemon(b.tb, b.logs, program, filepath.Join(b.bins, program), args...)
	d.Start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pid, err := pidOf(program, listen)
		if err == nil {
			b.procs = append(b.procs, proc{program, pid})
			return
		}
		if time.Now().After(deadline) || !d.Running() {
			b.tb.Fatalf("%s did not start (its log: %s): %v", program, d.Log, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startFleet makes the hosts, each with its node identity, seeds their
// sandboxes and starts them, their first publishes spread over one
// interval.
func (b *bench) startFleet() {
	tb, o := b.tb, b.o
	hostLog, err := os.OpenFile(filepath.Join(b.logs, "fleetsim-hosts.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	b.must(err)
	tb.Cleanup(func() { _ = hostLog.Close() })
	teams := make([]string, o.Teams)
	for i := range teams {
		teams[i] = teamName(i)
	}
	start := time.Now()
	b.fleet, err = fleetsim.New(fleetsim.Config{
		Hosts: o.Hosts, SandboxesPerHost: o.SandboxesPerHost, Teams: teams, Token: b.token,
		Identity: func(node string) (*rest.Config, error) { return b.env.NodeUser(tb, node).Config, nil },
		Publish:  publish.Options{Interval: o.Interval, MinInterval: o.minInterval(), SandboxShards: o.Shards, ShardFormat: publish.ShardFormat(o.ShardFormat), MaxChanges: o.MaxChanges},
		Writes:   b.writes,
		Log:      slog.New(slog.NewTextHandler(hostLog, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	b.must(err)
	b.must(b.fleet.Start(b.ctx, o.Interval))
	tb.Cleanup(b.fleet.Stop)
	b.procs = append(b.procs, proc{"fleetsim", os.Getpid()})
	b.say("%d hosts made and seeded in %s; their first publishes spread over %s", o.Hosts, time.Since(start).Round(time.Millisecond), o.Interval)
}

// waitListed waits until the aggregated list counts every sandbox, the
// timed team's e2b list answers, and the proxy routes a sandbox of every
// host; it records how long that took and how big an inventory is.
func (b *bench) waitListed(total int) error {
	start := time.Now()
	deadline := start.Add(10*time.Minute + 3*b.o.Interval)
	var last string
	lastSaid := start
	for {
		if err := b.ctx.Err(); err != nil {
			return err
		}
		n, err := b.kubeCount(b.ctx, "")
		switch {
		case err != nil:
			last = "kubectl list: " + err.Error()
		case n != total:
			last = fmt.Sprintf("kubectl lists %d of %d sandboxes", n, total)
		default:
			last = b.routedEverywhere()
		}
		if last == "" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every sandbox listed and routed within %s: %s", deadline.Sub(start).Round(time.Second), last)
		}
		if time.Since(lastSaid) > 10*time.Second {
			b.say("waiting: %s", last)
			lastSaid = time.Now()
		}
		time.Sleep(500 * time.Millisecond)
	}
	took := time.Since(start)
	b.rep.add(PhaseSetup, "all_listed_after", "", took.Seconds(), "s")
	b.say("every sandbox listed and routed %s after the hosts started", took.Round(100*time.Millisecond))
	b.inventorySize()
	return nil
}

// routedEverywhere checks the timed team's e2b list and the proxy's route
// to a sandbox of every host; it says what is not there yet, or "".
func (b *bench) routedEverywhere() string {
	if n, err := b.e2bCount(b.ctx, ""); err != nil || n == 0 {
		return fmt.Sprintf("e2b list of %s: %d sandboxes, %v", b.team, n, err)
	}
	for _, h := range b.fleet.Hosts() {
		sb := h.Sandboxd().Random()
		if code, body, _ := fleetenv.ProxyHealthBody(b.proxyURL, sb.GetId()); code != http.StatusNoContent {
			return fmt.Sprintf("the proxy answers %d for %s on %s: %s", code, sb.GetId(), h.Name(), strings.TrimSpace(string(body)))
		}
	}
	return ""
}

// inventorySize records the size of the first host's inventory as its
// publisher sends it, and of one entry.
func (b *bench) inventorySize() {
	inv, err := b.fleet.Hosts()[0].Inventory()
	if err != nil {
		b.say("inventory size: %v", err)
		return
	}
	now := metav1.Now()
	inv.PublishedAt = &now
	full, _ := json.Marshal(inv)
	n := len(inv.Spec.Sandboxes)
	inv.Spec.Sandboxes = nil
	empty, _ := json.Marshal(inv)
	b.rep.add(PhaseSetup, "inventory_bytes", "", float64(len(full)), "B")
	if n > 0 {
		b.rep.add(PhaseSetup, "inventory_entry_bytes", "", float64(len(full)-len(empty))/float64(n), "B")
	}
}
