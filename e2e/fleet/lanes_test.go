package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory/kubeinventory"
	"github.com/skiff-dev/skiff/shared/spawn"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// TestLanes runs the four freshness lanes on one fleet, in order; each
// lane leaves the fleet whole for the next.
func TestLanes(t *testing.T) {
	f := newFleet(t, configFromEnv(t))
	w := f.watch()
	l := &lanes{f: f, w: w}
	// Sandboxes on both hosts: 7 on B, the rest on A.
	l.spread(7)
	t.Run("A", l.laneA)
	t.Run("B", l.laneB)
	t.Run("C", l.laneC)
	t.Run("D", l.laneD)
	t.Run("SDK", l.sdk)
	t.Run("lists-agree", l.listsAgree)
	t.Run("snapshots", l.snapshots)
	t.Run("volumes", l.volumes)
}

type lanes struct {
	f *fleet
	w *watcher
	// onA and onB are team-a's long-lived sandboxes on each host.
	onA, onB []string
}

// spread creates sandboxes until nB are on B.
func (l *lanes) spread(nB int) {
	f := l.f
	for i := 0; len(l.onB) < nB; i++ {
		if i >= 6*nB {
			f.t.Fatalf("%d creates put %d sandboxes on %s, want %d", i, len(l.onB), hostB, nB)
		}
		id, node, _, err := f.create(f.replicas[i%2])
		if err != nil {
			f.t.Fatal(err)
		}
		if node == hostB {
			l.onB = append(l.onB, id)
		} else {
			l.onA = append(l.onA, id)
		}
	}
}

// listed reports which of ids each reader lists: both replicas' e2b lists
// and the kube list, as "" when all of them list all of ids (want true)
// or none of them lists any (want false), else what differs.
func (l *lanes) listed(ids []string, want bool) string {
	bad, err := l.e2bDiffers(ids, want)
	if err != nil {
		return err.Error()
	}
	kube, err := l.f.kubeList()
	if err != nil {
		return "kube list: " + err.Error()
	}
	for _, id := range ids {
		if _, ok := kube[id]; ok != want {
			bad = append(bad, fmt.Sprintf("kube %s=%v", id, ok))
		}
	}
	if len(bad) > 0 {
		return strings.Join(bad[:min(len(bad), 4)], ", ")
	}
	return ""
}

// e2bDiffers returns, for each running replica's e2b list, the ids whose
// presence is not want.
func (l *lanes) e2bDiffers(ids []string, want bool) ([]string, error) {
	var bad []string
	for _, r := range l.f.replicas {
		if !r.d.Running() {
			continue
		}
		got, err := l.f.e2bList(r)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if got[id] != want {
				bad = append(bad, fmt.Sprintf("%s e2b %s=%v", r.name, id, got[id]))
			}
		}
	}
	return bad, nil
}

// p50 of ds.
func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// creates makes n sandboxes through both replicas, kills them, and returns
// their nodes and times.
func (l *lanes) creates(t *testing.T, n int) (nodes map[string]int, took []time.Duration) {
	f := l.f
	nodes = map[string]int{}
	var ids []string
	for i := range n {
		id, node, d, err := f.create(f.replicas[i%len(f.replicas)])
		if err != nil {
			t.Errorf("create %d: %v", i, err)
			continue
		}
		nodes[node]++
		took = append(took, d)
		ids = append(ids, id)
	}
	var killed []string
	for _, id := range ids {
		if code, body := f.call(f.replicas[0], http.MethodDelete, "/sandboxes/"+id, nil); code != http.StatusNoContent {
			t.Errorf("kill %s: %d %s", id, code, body)
			continue
		}
		killed = append(killed, id)
	}
	if len(took) == 0 {
		t.Fatal("no create succeeded")
	}
	// The kills are in their hosts' inventories before the lane goes on: a
	// lane that reads an inventory next (lane A's sandboxes of B, whose
	// DELETED it then waits for) must not find them there, one publish
	// late.
	f.eventually(30*time.Second, "the creates' kills published", func() string {
		for node := range nodes {
			if inv := f.inventory(node); inv != nil {
				for _, sb := range inv.Spec.Sandboxes {
					if slices.Contains(killed, sb.ID) {
						return fmt.Sprintf("%s's inventory still has %s", node, sb.ID)
					}
				}
			}
		}
		return ""
	})
	return nodes, took
}

// killHost kills B's vk-sandbox and sandboxd with SIGKILL, and returns the
// stamp of B's last publish.
func (l *lanes) killHost(name string) time.Time {
	h := l.f.hosts[name]
	h.vk.Kill9()
	h.h.Sandboxd.Kill9()
	return l.f.publishedAt(name)
}

// restartHost starts B's sandboxd, then its vk-sandbox.
func (l *lanes) restartHost(t *testing.T, name string) {
	h := l.f.hosts[name]
	h.h.StartSandboxd(t)
	h.vk.Start()
}

func (l *lanes) laneA(t *testing.T) {
	f, cfg := l.f, l.f.cfg
	ctx := t.Context()
	t.Run("A-01", func(t *testing.T) {
		start := time.Now()
		f.eventually(30*time.Second, "B's sandboxes listed", func() string { return l.listed(l.onB, true) })
		lineOK(t, true, "%d sandboxes of %s in both replicas' e2b lists and the kube list (%s)", len(l.onB), hostB, time.Since(start).Round(time.Millisecond))
	})
	var baseline time.Duration
	t.Run("A-02", func(t *testing.T) {
		nodes, took := l.creates(t, 30)
		baseline = p50(took)
		lineOK(t, nodes[hostA] > 0 && nodes[hostB] > 0, "30 creates: p50 %s, on %v", baseline.Round(time.Millisecond), nodes)
	})
	syn := newSynCounter(t, f.hosts[hostB].ns, 27777)
	// B's warm sandboxes leave too.
	var bAll []string
	if inv := f.inventory(hostB); inv != nil {
		for _, sb := range inv.Spec.Sandboxes {
			bAll = append(bAll, sb.ID)
		}
	}
	watchFrom := l.w.len()
	last := l.killHost(hostB)
	logf("lane A: killed %s's vk-sandbox and sandboxd (SIGKILL); its last publish %s", hostB, last.Format(time.RFC3339))
	t.Run("A-03", func(t *testing.T) {
		var left time.Duration
		early := ""
		f.eventually(cfg.window+cfg.interval+30*time.Second, "B's sandboxes leave every list", func() string {
			msg := l.listed(l.onB, false)
			if msg == "" {
				left = time.Since(last)
				return ""
			}
			if early == "" && time.Since(last) < cfg.window {
				if l.listed(l.onB, true) != "" {
					early = fmt.Sprintf("some left %s after the last publish, before the window", time.Since(last).Round(time.Millisecond))
				}
			}
			return msg
		})
		// Stamps have whole seconds: the reference can reach the window a
		// second late, and the lists follow it within a second.
		hi := cfg.window + cfg.interval + 2*time.Second
		lineOK(t, early == "" && left >= cfg.window && left <= hi, "%s's sandboxes left both lists %s after its last publish (window %s, interval %s, bound %s) %s",
			hostB, left.Round(100*time.Millisecond), cfg.window, cfg.interval, hi, early)
	})
	// A-08's counting starts at the window + 2 s.
	time.Sleep(time.Until(last.Add(cfg.window + 2*time.Second)))
	syn0 := syn.count(t)
	t.Run("A-04", func(t *testing.T) {
		deleted := map[string]bool{}
		for _, ev := range l.w.since(watchFrom) {
			if ev.Type == watch.Deleted {
				if o, ok := ev.Object.(client.Object); ok {
					deleted[o.GetName()] = true
				}
			}
		}
		var missing []string
		for _, id := range bAll {
			if !deleted[id] {
				missing = append(missing, id)
			}
		}
		lineOK(t, len(missing) == 0 && len(bAll) >= len(l.onB), "DELETED for %d of %d sandboxes of %s (missing %v)", len(bAll)-len(missing), len(bAll), hostB, missing)
	})
	t.Run("A-05", func(t *testing.T) {
		var bad []string
		for _, r := range f.replicas {
			for _, m := range []string{http.MethodGet, http.MethodDelete} {
				if code, body := f.call(r, m, "/sandboxes/"+l.onB[0], nil); code != http.StatusNotFound {
					bad = append(bad, fmt.Sprintf("%s %s %d %s", r.name, m, code, body))
				}
			}
		}
		lineOK(t, len(bad) == 0, "GET and DELETE of %s on both replicas: 404 %v", l.onB[0], bad)
	})
	t.Run("A-06", func(t *testing.T) {
		nodes, took := l.creates(t, 30)
		p, worst := p50(took), slices.Max(took)
		ok := nodes[hostB] == 0 && p <= 2*baseline+50*time.Millisecond && worst < 5*time.Second
		lineOK(t, ok, "30 creates: p50 %s (baseline %s), slowest %s, on %v", p.Round(time.Millisecond), baseline.Round(time.Millisecond), worst.Round(time.Millisecond), nodes)
	})
	t.Run("A-07", func(t *testing.T) {
		var worst time.Duration
		var bad []string
		for i := range 20 {
			id := l.onB[i%len(l.onB)]
			if i%2 == 1 {
				id = fmt.Sprintf("i%019d", i) // never made
			}
			code, d := f.proxyGet(id)
			worst = max(worst, d)
			if code != http.StatusBadGateway {
				bad = append(bad, fmt.Sprintf("%s: %d", id, code))
			}
		}
		lineOK(t, len(bad) == 0 && worst < time.Second, "20 proxy requests for unknown sandboxes: 502, slowest %s %v", worst.Round(time.Millisecond), bad)
	})
	t.Run("A-08", func(t *testing.T) {
		// Ask for everything once more, then count.
		_, _ = f.e2bList(f.replicas[1])
		_, _ = f.kubeList()
		n := syn.count(t) - syn0
		lineOK(t, n == 0, "%d connection attempts reached %s's sandboxd address from window + 2 s on", n, hostB)
	})
	t.Run("A-09", func(t *testing.T) {
		start := time.Now()
		l.restartHost(t, hostB)
		f.eventually(cfg.interval+60*time.Second, "B's sandboxes back in every list", func() string { return l.listed(l.onB, true) })
		back := time.Since(start)
		lineOK(t, true, "%s restarted: its %d sandboxes back in both lists %s after the restart", hostB, len(l.onB), back.Round(100*time.Millisecond))
	})
	_ = ctx
}

// quiet waits until the watch has had no event for two publish intervals,
// and returns its length.
func (l *lanes) quiet(t *testing.T) int {
	n, since := l.w.len(), time.Now()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Since(since) < 2*l.f.cfg.interval {
		if time.Now().After(deadline) {
			t.Fatalf("the kube watch never went quiet: %v", l.w.since(n))
		}
		time.Sleep(200 * time.Millisecond)
		if m := l.w.len(); m != n {
			n, since = m, time.Now()
		}
	}
	return n
}

func (l *lanes) laneB(t *testing.T) {
	f, cfg := l.f, l.f.cfg
	all := append(slices.Clone(l.onA), l.onB...)
	f.eventually(time.Minute, "every sandbox listed", func() string { return l.listed(all, true) })
	from := l.quiet(t)
	offsets := map[string]int64{}
	for _, r := range f.replicas {
		offsets[r.d.Log] = fileSize(r.d.Log)
	}
	t.Run("B-01", func(t *testing.T) {
		h := f.hosts[hostB]
		h.vk.Stop()
		h.vk.Start()
		restarted := time.Now()
		var gaps []string
		// Through the window, and two intervals more.
		for time.Since(restarted) < cfg.window+2*cfg.interval {
			if f.inventory(hostB) == nil {
				gaps = append(gaps, "inventory gone")
			}
			if msg := l.listed(all, true); msg != "" {
				gaps = append(gaps, msg)
			}
			time.Sleep(200 * time.Millisecond)
		}
		events := l.w.since(from)
		var named []string
		for path, off := range offsets {
			named = append(named, grepLogs(path, off, hostB)...)
		}
		lineOK(t, len(gaps) == 0 && len(events) == 0 && len(named) == 0,
			"vk-sandbox of %s restarted (SIGTERM): inventory and lists unchanged for %s (%d gaps), %d watch events, %d apiserver log lines name %s %v",
			hostB, (cfg.window + 2*cfg.interval), len(gaps), len(events), len(named), hostB, append(gaps[:min(len(gaps), 2)], named[:min(len(named), 2)]...))
	})
}

func (l *lanes) laneC(t *testing.T) {
	f, cfg := l.f, l.f.cfg
	t.Run("C-01", func(t *testing.T) {
		h := f.hosts[hostB]
		h.vk.Stop()
		// The inventory as a publisher from before publishedAt writes it.
		inv := f.inventory(hostB)
		if inv == nil {
			t.Fatal("no inventory of " + hostB)
		}
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"publishedAt":null}`))
		f.must(f.admin.Patch(t.Context(), inv, patch))
		if f.inventory(hostB).PublishedAt != nil {
			t.Fatal("publishedAt still set")
		}
		start := time.Now()
		var gaps []string
		for time.Since(start) < cfg.window+2*cfg.interval {
			if msg := l.listed(l.onB, true); msg != "" {
				gaps = append(gaps, msg)
			}
			time.Sleep(200 * time.Millisecond)
		}
		lineOK(t, len(gaps) == 0, "%s's inventory without publishedAt: its %d sandboxes listed throughout %s (%d gaps %v)",
			hostB, len(l.onB), cfg.window+2*cfg.interval, len(gaps), gaps[:min(len(gaps), 2)])
		h.vk.Start()
		f.eventually(time.Minute, "B stamps again", func() string {
			if f.publishedAt(hostB).IsZero() {
				return "no stamp"
			}
			return ""
		})
	})
}

// outage stops the kube-apiserver for d, calling during every 200 ms
// meanwhile, then starts it again.
func (l *lanes) outage(t *testing.T, d time.Duration, during func(elapsed time.Duration)) {
	f := l.f
	f.env.StopAPIServer(t)
	start := time.Now()
	for time.Since(start) < d {
		during(time.Since(start))
		time.Sleep(200 * time.Millisecond)
	}
	f.env.StartAPIServer(t)
	logf("lane D: the kube-apiserver was down %s", time.Since(start).Round(100*time.Millisecond))
}

// viewAge is how old the newest publish a replica has seen is (its
// freshness reference), or why that is not known.
func (l *lanes) viewAge(r *replica) string {
	m := hosttest.Metric(r.admin, "skiff_apiserver_fleet_reference_timestamp_seconds")
	ref, err := strconv.ParseFloat(m, 64)
	if err != nil {
		return fmt.Sprintf("(reference %q: %v)", m, err)
	}
	return time.Since(time.Unix(int64(ref), 0)).Round(time.Second).String()
}

// e2bListed reports whether every running replica's e2b list shows
// every sandbox of ids (the kube list needs the kube-apiserver), as "" or
// what is missing.
func (l *lanes) e2bListed(ids []string) string {
	bad, err := l.e2bDiffers(ids, true)
	if err != nil {
		return err.Error()
	}
	if len(bad) > 0 {
		return strings.Join(bad[:min(len(bad), 4)], ", ")
	}
	return ""
}

func (l *lanes) laneD(t *testing.T) {
	f, cfg := l.f, l.f.cfg
	all := append(slices.Clone(l.onA), l.onB...)
	long := max(cfg.window, cfg.lease) + 2*cfg.interval
	f.eventually(time.Minute, "every sandbox listed before the outage", func() string { return l.listed(all, true) })
	t.Run("D-01", func(t *testing.T) {
		f.eventually(time.Minute, "a leader", func() string {
			if f.leader() == nil {
				return "no replica holds the lease"
			}
			return ""
		})
		var follower *replica
		for _, r := range f.replicas {
			if r != f.leader() {
				follower = r
			}
		}
		var gaps []string
		claim, claimBody := 0, ""
		l.outage(t, long, func(elapsed time.Duration) {
			if msg := l.e2bListed(all); msg != "" {
				gaps = append(gaps, msg)
			}
			if claim == 0 && elapsed > long/2 {
				code, body := f.call(follower, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
				claim, claimBody = code, string(body)
			}
		})
		lineOK(t, len(gaps) == 0 && claim == http.StatusCreated, "kube-apiserver down %s: every sandbox listed on both replicas (%d gaps %v); a create on %s (no lease): %d %s",
			long, len(gaps), gaps[:min(len(gaps), 2)], follower.name, claim, claimBody[:min(len(claimBody), 120)])
		f.eventually(time.Minute, "the kube list back", func() string { return l.listed(all, true) })
	})
	t.Run("D-02", func(t *testing.T) {
		r2 := f.replicas[1]
		r2.d.Stop()
		r1 := f.replicas[0]
		f.eventually(cfg.lease+30*time.Second, "replica 1 leads", func() string {
			if f.leader() != r1 {
				return "replica 1 does not hold the lease"
			}
			return ""
		})
		steppedDown, exited := false, false
		var gaps []string
		l.outage(t, long, func(time.Duration) {
			if hosttest.Metric(r1.admin, "skiff_apiserver_warm_pool_leader") == "0" {
				steppedDown = true
			}
			if !r1.d.Running() {
				exited = true
			}
			if msg := l.e2bListed(all); msg != "" {
				gaps = append(gaps, msg)
			}
		})
		start := time.Now()
		f.eventually(cfg.lease+time.Minute, "replica 1 leads again and the pool is full", func() string {
			if f.leader() != r1 {
				return "replica 1 does not lead"
			}
			if n := len(f.warm()); n != warmReplicas {
				// How old replica 1's view of the fleet is tells a cache that
				// does not watch again from a driver that does not act.
				return fmt.Sprintf("%d warm sandboxes; replica 1's newest publish seen %s ago", n, l.viewAge(r1))
			}
			return ""
		})
		lineOK(t, steppedDown && !exited && len(gaps) == 0, "one replica, kube-apiserver down %s: stepped down %v, exited %v, %d gaps; leading again with the pool full %s after",
			long, steppedDown, exited, len(gaps), time.Since(start).Round(100*time.Millisecond))
		r2.d.Start()
		f.eventually(time.Minute, "replica 2 serves", func() string { return l.e2bListed(all) })
	})
	t.Run("D-03", func(t *testing.T) {
		h := f.hosts[hostB]
		h.vk.Kill9()
		h.h.Sandboxd.Kill9()
		l.outage(t, cfg.window+cfg.interval, func(time.Duration) {})
		back := time.Now()
		// A replica has seen A publish since the outage once its freshness
		// reference (the newest stamp it has seen, a metric) is past the
		// outage. The replicas' informers watch again within
		// fleetsource.RetryMax of the kube-apiserver's return.
		after := float64(back.Truncate(time.Second).Unix())
		seen, left := map[*replica]time.Time{}, map[*replica]time.Duration{}
		f.eventually(2*time.Minute, "each replica sees A publish, then B leaves", func() string {
			for _, r := range f.replicas {
				if _, done := left[r]; done {
					continue
				}
				list, err := f.e2bList(r)
				if err != nil {
					return err.Error()
				}
				if ref, err := strconv.ParseFloat(hosttest.Metric(r.admin, "skiff_apiserver_fleet_reference_timestamp_seconds"), 64); seen[r].IsZero() && err == nil && ref >= after {
					seen[r] = time.Now()
				}
				gone := true
				for _, id := range l.onB {
					gone = gone && !list[id]
				}
				if !seen[r].IsZero() && gone {
					left[r] = time.Since(seen[r])
				}
			}
			if len(left) < len(f.replicas) {
				return fmt.Sprintf("seen %v, left %v", seen, left)
			}
			return ""
		})
		f.eventually(10*time.Second, "B leaves the kube list", func() string { return l.listed(l.onB, false) })
		// The recovery keeps the hosts fresh before the outage for one
		// interval after the reader saw the jump (1 s more for the lists and
		// the scrapes).
		hi := cfg.interval + time.Second
		ok := true
		var figs []string
		for _, r := range f.replicas {
			ok = ok && left[r] <= hi
			figs = append(figs, fmt.Sprintf("%s: left %s after it saw %s publish, which was %s after the control plane returned",
				r.name, left[r].Round(100*time.Millisecond), hostA, seen[r].Sub(back).Round(100*time.Millisecond)))
		}
		lineOK(t, ok, "%s dead through the outage (bound %s): %s", hostB, hi, strings.Join(figs, "; "))

		l.restartHost(t, hostB)
		f.eventually(time.Minute, "B back", func() string { return l.listed(all, true) })
	})
	t.Run("D-04", func(t *testing.T) {
		// The hosts cannot write; the readers stay connected.
		for _, h := range f.hosts {
			h.kube.Cut()
		}
		cut := time.Now()
		errs := map[string]int{}
		check := func() {
			for _, r := range f.replicas {
				for _, id := range []string{l.onA[0], l.onB[0]} {
					if code, _ := f.call(r, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusOK {
						errs[fmt.Sprintf("%s GET %d", r.name, code)]++
					}
				}
			}
			for _, id := range []string{l.onA[0], l.onB[0]} {
				if code, _ := f.proxyGet(id); code/100 != 2 {
					errs[fmt.Sprintf("proxy %d", code)]++
				}
			}
			if msg := l.listed(all, true); msg != "" {
				errs["lists: "+msg]++
			}
		}
		for time.Since(cut) < cfg.window+2*cfg.interval {
			check()
			time.Sleep(200 * time.Millisecond)
		}
		for _, h := range f.hosts {
			h.kube.Restore()
		}
		restored := time.Now()
		for time.Since(restored) < 3*cfg.interval {
			check()
			time.Sleep(100 * time.Millisecond)
		}
		lineOK(t, len(errs) == 0, "inventory writes refused %s (window %s), then allowed: %d errors for live sandboxes on both replicas and the proxy %v",
			restored.Sub(cut).Round(100*time.Millisecond), cfg.window, len(errs), errs)
	})
}

// sdk runs the e2b SDK suite (e2e/sdk, the latest pinned SDK) against the
// fleet through the proxy.
func (l *lanes) sdk(t *testing.T) {
	f := l.f
	dir := "../sdk"
	if _, err := os.Stat(dir + "/node_modules/e2b"); err != nil {
		t.Fatal("the SDKs are not installed: run `npm ci` in e2e/sdk (make sdk-deps does)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "sdk.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_PACKAGE=e2b", "E2B_API_URL="+f.replicas[0].api, "E2B_VOLUME_API_URL="+f.replicas[0].api, "E2B_SANDBOX_URL="+f.proxyURL,
		"E2B_API_KEY="+f.key, "SKIFF_API_KEY_B="+f.keyB)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	start := time.Now()
	err := spawn.Start(cmd, syscall.SIGKILL)
	if err == nil {
		err = cmd.Wait()
	}
	out := output.Bytes()
	if err != nil {
		t.Logf("node --test:\n%s", out)
	}
	lineOK(t, err == nil, "the e2b SDK suite through the fleet's proxy: %v in %s", errOr(err, "passed"), time.Since(start).Round(time.Second))
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

// listsAgree: kubectl get sandboxes -A shows team-a's e2b list.
func (l *lanes) listsAgree(t *testing.T) {
	f := l.f
	var diff string
	f.eventually(30*time.Second, "the lists agree", func() string {
		e2b, err := f.e2bList(f.replicas[0])
		if err != nil {
			return err.Error()
		}
		kube, err := f.kubeList()
		if err != nil {
			return err.Error()
		}
		var inv v1beta1.NodeInventoryList
		f.must(f.admin.List(t.Context(), &inv))
		f.must(kubeinventory.Join(t.Context(), f.admin, inv.Items))
		teamOf := map[string]string{}
		for _, n := range inv.Items {
			for _, sb := range n.Spec.Sandboxes {
				teamOf[sb.ID] = sb.Team
			}
		}
		var miss []string
		for id := range e2b {
			if _, ok := kube[id]; !ok {
				miss = append(miss, "kube lacks "+id)
			}
		}
		for id := range kube {
			if teamOf[id] == team && !e2b[id] {
				miss = append(miss, "e2b lacks "+id)
			}
		}
		diff = strings.Join(miss, ", ")
		return diff
	})
	lineOK(t, diff == "", "kubectl get sandboxes -A agrees with the e2b list")
}
