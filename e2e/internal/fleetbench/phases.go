package fleetbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/fleetsim"
	"github.com/skiff-dev/skiff/e2e/internal/procstat"
	"github.com/skiff-dev/skiff/shared/testing/hosttest"
)

// etcdCounters are etcd's metrics a phase reads: bytes written to its
// write-ahead log, bytes its clients (the kube-apiserver) sent it, puts,
// and the size of its database.
var etcdCounters = []string{
	"etcd_disk_wal_write_bytes_total",
	"etcd_network_client_grpc_received_bytes_total",
	"etcd_mvcc_put_total",
	"etcd_mvcc_db_total_size_in_bytes",
}

// counters is what the processes and etcd have counted at one instant.
type counters struct {
	at   time.Time
	cpu  map[string]float64 // process → CPU seconds
	etcd map[string]float64
}

func (b *bench) counters() (counters, error) {
	c := counters{at: time.Now(), cpu: map[string]float64{}}
	for _, p := range b.procs {
		s, err := procstat.CPUSeconds(p.pid, false)
		if err != nil {
			return c, fmt.Errorf("cpu of %s: %w", p.name, err)
		}
		c.cpu[p.name] = s
	}
	page, err := hosttest.MetricsPage(b.env.EtcdURL().Host)
	if err != nil {
		return c, fmt.Errorf("etcd's metrics: %w", err)
	}
	c.etcd = samples(page, etcdCounters...)
	for _, n := range etcdCounters {
		if _, ok := c.etcd[n]; !ok {
			return c, fmt.Errorf("etcd's metrics have no %s", n)
		}
	}
	return c, nil
}

// measure runs one phase of --steady: work (nil for none) and the probes
// run until it ends; then it records what etcd, the processes, the
// publishers and the probes did over it.
func (b *bench) measure(phase string, work func(ctx context.Context)) error {
	b.say("%s: measuring for %s", phase, b.o.Steady)
	b.writes.Take()
	c0, err := b.counters()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.o.Steady)
	defer cancel()
	var list, kube, route latencies
	var wg sync.WaitGroup
	wg.Go(func() { probe(ctx, 250*time.Millisecond, &list, b.probeList) })
	wg.Go(func() { probe(ctx, time.Second, &kube, b.probeKube) })
	wg.Go(func() { probe(ctx, 100*time.Millisecond, &route, b.probeProxy(c0.at)) })
	if work != nil {
		wg.Go(func() { work(ctx) })
	}
	for program, admin := range b.admins {
		wg.Go(func() { b.profile(phase, program, admin) })
	}
	wg.Wait()
	if err := b.ctx.Err(); err != nil {
		return err
	}
	c1, err := b.counters()
	if err != nil {
		return err
	}
	secs := c1.at.Sub(c0.at).Seconds()
	rate := func(name string) float64 { return (c1.etcd[name] - c0.etcd[name]) / secs }
	r := b.rep
	r.add(phase, "etcd_wal_write", "etcd", rate("etcd_disk_wal_write_bytes_total"), "B/s")
	r.add(phase, "etcd_client_received", "etcd", rate("etcd_network_client_grpc_received_bytes_total"), "B/s")
	r.add(phase, "etcd_puts", "etcd", rate("etcd_mvcc_put_total"), "1/s")
	r.add(phase, "etcd_db_size", "etcd", c1.etcd["etcd_mvcc_db_total_size_in_bytes"], "B")
	w := b.writes.Take()
	r.add(phase, "inventory_applies", "hosts", float64(w.OK)/secs, "1/s")
	r.add(phase, "inventory_apply_failures", "hosts", float64(w.Failed), "count")
	r.add(phase, "inventory_apply_p50", "hosts", ms(percentile(w.Took, 50)), "ms")
	r.add(phase, "inventory_apply_p99", "hosts", ms(percentile(w.Took, 99)), "ms")
	for _, p := range b.procs {
		r.add(phase, "cpu", p.name, 100*(c1.cpu[p.name]-c0.cpu[p.name])/secs, "%core")
		m, err := procstat.ReadMemory(p.pid)
		if err != nil {
			return fmt.Errorf("memory of %s: %w", p.name, err)
		}
		r.add(phase, "rss", p.name, float64(m.RSS), "B")
		r.add(phase, "rss_peak", p.name, float64(m.Peak), "B")
		r.add(phase, "pss", p.name, float64(m.PSS), "B")
	}
	list.record(r, phase, "e2b_list_page", "sandbox-apiserver")
	kube.record(r, phase, "kubectl_list_page", "sandbox-apiserver")
	route.record(r, phase, "proxy_lookup", "sandbox-envd-proxy")
	b.say("%s: etcd WAL %.2f MB/s, %.1f applies/s, kube-apiserver %.0f%% of a core", phase,
		rate("etcd_disk_wal_write_bytes_total")/1e6, float64(w.OK)/secs, 100*(c1.cpu["kube-apiserver"]-c0.cpu["kube-apiserver"])/secs)
	return nil
}

// churn is the churn phase's work: the churn itself on the hosts, and
// --creates creates, each deleted after, through the e2b API.
func (b *bench) churn(ctx context.Context) {
	var wg sync.WaitGroup
	var st fleetsim.ChurnStats
	wg.Go(func() { st = b.fleet.Churn(ctx, b.o.Churn*float64(b.fleet.Sandboxes())) })
	var creates, deletes latencies
	wg.Go(func() { b.createDelete(ctx, &creates, &deletes) })
	wg.Wait()
	r := b.rep
	r.add(PhaseChurn, "churn", "hosts", float64(st.Created+st.Killed)/st.Took.Seconds(), "1/s")
	creates.record(r, PhaseChurn, "create", "sandbox-apiserver")
	deletes.record(r, PhaseChurn, "delete", "sandbox-apiserver")
}

// createDelete creates --creates sandboxes of the timed team through the
// e2b API, spread over the phase, deleting each after its create.
func (b *bench) createDelete(ctx context.Context, creates, deletes *latencies) {
	every := b.o.Steady / time.Duration(b.o.Creates+1)
	t := time.NewTicker(every)
	defer t.Stop()
	for range b.o.Creates {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		var out struct{ SandboxID string }
		code, body, err := b.e2b(ctx, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","timeout":600,"metadata":{"user":"u-bench"}}`, &out)
		if err != nil && ended(ctx) {
			return // cut by the phase's end
		}
		if err != nil || code != http.StatusCreated {
			creates.fail(fmt.Sprintf("create: %d %s %v", code, body, err))
			continue
		}
		creates.ok(time.Since(start))
		start = time.Now()
		if code, body, err := b.e2b(ctx, http.MethodDelete, "/sandboxes/"+out.SandboxID, "", nil); err != nil && ended(ctx) {
			return // cut by the phase's end; the sandbox ends with the fleet
		} else if err != nil || code != http.StatusNoContent {
			deletes.fail(fmt.Sprintf("delete %s: %d %s %v", out.SandboxID, code, body, err))
			continue
		}
		deletes.ok(time.Since(start))
	}
}

// latencies are a probe's times and failures.
type latencies struct {
	mu      sync.Mutex
	took    []time.Duration
	failed  int
	lastErr string
}

func (l *latencies) ok(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.took = append(l.took, d)
}

func (l *latencies) fail(msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed++
	l.lastErr = msg
}

// record adds the probe's p50, p99, count and failures to r.
func (l *latencies) record(r *Report, phase, metric, component string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.add(phase, metric+"_p50", component, ms(percentile(l.took, 50)), "ms")
	r.add(phase, metric+"_p99", component, ms(percentile(l.took, 99)), "ms")
	r.add(phase, metric+"_count", component, float64(len(l.took)), "count")
	r.add(phase, metric+"_failures", component, float64(l.failed), "count")
	if l.lastErr != "" {
		r.notes = append(r.notes, fmt.Sprintf("%s %s: %d failures, the last: %s", phase, metric, l.failed, l.lastErr))
	}
}

// probe calls fn every period (or back to back when it takes longer)
// until ctx ends, timing each call that succeeds.
func probe(ctx context.Context, period time.Duration, l *latencies, fn func(ctx context.Context) error) {
	for {
		start := time.Now()
		err := fn(ctx)
		if ended(ctx) {
			return // cut by the phase's end: neither a time nor a failure
		}
		if err != nil {
			l.fail(err.Error())
		} else {
			l.ok(time.Since(start))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(period))):
		}
	}
}

// ended reports whether ctx is done or its deadline has passed. A call
// cut by the deadline may return before ctx says so: client-go's rate
// limiter refuses to wait past a deadline ("would exceed context
// deadline") once the clock passes it, before ctx's timer has fired,
// which on a loaded machine is a while later.
func ended(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(deadline)
}

// probeList asks for the first page (100) of the timed team's sandboxes.
func (b *bench) probeList(ctx context.Context) error {
	n, err := b.e2bCount(ctx, "")
	if err == nil && n == 0 {
		err = fmt.Errorf("e2b list of %s: empty", b.team)
	}
	return err
}

// probeKube asks for the first page (500) of every team's sandboxes
// through the aggregator, as kubectl get sandboxes -A does.
func (b *bench) probeKube(ctx context.Context) error {
	n, err := b.kubePage(ctx, 500, "")
	if err == nil && n == 0 {
		err = fmt.Errorf("kubectl list: empty")
	}
	return err
}

// probeProxy returns a probe that asks the proxy for envd's /health in a
// sandbox of a running host picked at random that started before since
// (so that its host has published it).
func (b *bench) probeProxy(since time.Time) func(ctx context.Context) error {
	return func(context.Context) error {
		hosts := b.fleet.Hosts()
		for range 20 {
			h := hosts[randIntN(len(hosts))]
			sb := h.Sandboxd().Random()
			if !h.Running() || sb == nil || !sb.GetStartedAt().AsTime().Before(since) {
				continue
			}
			code, body, _ := proxyHealth(b.proxyURL, sb.GetId())
			if code == http.StatusNoContent {
				return nil
			}
			if !h.Sandboxd().Has(sb.GetId()) {
				continue // the churn killed it meanwhile: another pick
			}
			return fmt.Errorf("proxy for %s on %s: %d %s", sb.GetId(), h.Name(), code, body)
		}
		return fmt.Errorf("no sandbox older than the phase found in 20 picks")
	}
}

// profile writes a CPU profile of program (served on admin) over most of
// the phase to --profile-dir; a failure is said, not fatal: the profile
// is for reading, not a result.
func (b *bench) profile(phase, program, admin string) {
	secs := max(1, int((b.o.Steady - 5*time.Second).Seconds()))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs)
	// Not the phase's context, which may end before the profile is
	// served; the run's.
	pctx, cancel := context.WithTimeout(b.ctx, time.Duration(secs)*time.Second+time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, url, nil)
	if err == nil {
		var resp *http.Response
		if resp, err = http.DefaultClient.Do(req); err == nil {
			defer resp.Body.Close()
			var data []byte
			if data, err = io.ReadAll(resp.Body); err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
			}
			if err == nil {
				name := filepath.Join(b.o.ProfileDir, phase+"-"+program+".pprof")
				if err = os.WriteFile(name, data, 0o644); err == nil {
					b.say("%s: CPU profile of %s in %s", phase, program, name)
					return
				}
			}
		}
	}
	b.say("%s: no CPU profile of %s: %v", phase, program, err)
}
