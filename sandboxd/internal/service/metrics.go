package service

import (
	"context"
	"path"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
)

// Kinds of start, a metric label.
const (
	kindCreate = "create"
	kindWarm   = "warm"
	// kindCreatePrepared labels the duration of a create that took a
	// prepared sandbox.
	kindCreatePrepared = "create_prepared"
)

const (
	metricsNamespace = "skiff"
	metricsSubsystem = "sandboxd"
)

// metrics are the service's Prometheus metrics (the server registers them
// with the process's own).
// Labels are closed sets (kinds, reasons, Connect codes, RPC methods):
// never a sandbox ID.
type metrics struct {
	creates        *prometheus.CounterVec
	kills          *prometheus.CounterVec
	claims         *prometheus.CounterVec
	autoResumes    *prometheus.CounterVec
	createDuration *prometheus.HistogramVec
	envdReady      prometheus.Histogram
	claimDuration  prometheus.Histogram
	rpcs           *prometheus.CounterVec
	watchResyncs   prometheus.Counter
	host           *hostCollector
}

func newMetrics(s *Service) *metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help}
	}
	hist := func(name, help string, buckets []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help, Buckets: buckets}
	}
	// Starts take milliseconds to seconds; the envd-ready timeout is 10 s.
	startBuckets := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &metrics{
		creates: prometheus.NewCounterVec(prometheus.CounterOpts(opts("creates_total",
			"Sandbox starts by kind (create, warm) and result (ok or the Connect code).")), []string{"kind", "result"}),
		kills: prometheus.NewCounterVec(prometheus.CounterOpts(opts("kills_total",
			"Sandbox kills by reason (api, deadline, claim_failed) and result.")), []string{"reason", "result"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts(opts("claims_total",
			"Claims of warm sandboxes by result.")), []string{"result"}),
		autoResumes: prometheus.NewCounterVec(prometheus.CounterOpts(opts("auto_resumes_total",
			"Paused sandboxes resumed by a relayed request (auto-resume), by result.")), []string{"result"}),
		createDuration: prometheus.NewHistogramVec(hist("create_duration_seconds",
			"Time from a start's request to its sandbox holding a token, by kind (create, create_prepared: a create that took a prepared sandbox, warm).", startBuckets), []string{"kind"}),
		envdReady: prometheus.NewHistogram(hist("envd_ready_duration_seconds",
			"Time from the runtime starting a sandbox to its envd answering /health.", startBuckets)),
		claimDuration: prometheus.NewHistogram(hist("claim_duration_seconds",
			"Time of a successful claim, new token included.", []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5})),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts(opts("rpc_requests_total",
			"API calls by method and result (ok or the Connect code).")), []string{"method", "code"}),
		watchResyncs: prometheus.NewCounter(prometheus.CounterOpts(opts("watch_resyncs_total",
			"Watch streams that fell behind and were sent a fresh snapshot."))),
	}
	m.host = &hostCollector{s: s}
	return m
}

// Collectors are the service's metrics, for the server's registry.
func (s *Service) Collectors() []prometheus.Collector {
	m := s.metrics
	return []prometheus.Collector{m.creates, m.kills, m.claims, m.autoResumes, m.createDuration, m.envdReady, m.claimDuration, m.rpcs, m.watchResyncs, m.host}
}

// resultOf is the result label of err: "ok" or its Connect code.
func resultOf(err error) string {
	if err == nil {
		return "ok"
	}
	return connect.CodeOf(err).String()
}

// countCreate counts a start of kind and returns its error.
func (s *Service) countCreate(kind string, err error) error {
	s.metrics.creates.WithLabelValues(kind, resultOf(err)).Inc()
	return err
}

// countClaim counts a claim and returns its error.
func (s *Service) countClaim(err error, took time.Duration) error {
	s.metrics.claims.WithLabelValues(resultOf(err)).Inc()
	if err == nil {
		s.metrics.claimDuration.Observe(took.Seconds())
	}
	return err
}

var (
	sandboxesDesc = prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, "sandboxes"),
		"Sandboxes on the host by state.", []string{"state"}, nil)
	allocatedDesc = prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, "allocated"),
		"Resources held by sandboxes and starts in flight (cpu in millicores, memory in MiB).", []string{"resource"}, nil)
	capacityDesc = prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, "capacity"),
		"Resources sandboxes may hold, after overcommit (cpu in millicores, memory in MiB, sandboxes); with CPU not admitted (--cpu-overcommit 0), cpu is the host's.", []string{"resource"}, nil)
)

// hostCollector reports the registry's contents at scrape time.
type hostCollector struct{ s *Service }

func (c *hostCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- allocatedDesc
	ch <- capacityDesc
}

func (c *hostCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{registry.StateRunning: 0, registry.StatePaused: 0, registry.StateWarm: 0}
	for _, rec := range c.s.reg.List() {
		if _, ok := counts[rec.State]; ok {
			counts[rec.State]++
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), state)
	}
	used, limits := c.s.reg.Usage(), c.s.cfg.Limits
	ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(used.CPUMilli), "cpu")
	ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(used.MemoryMiB), "memory")
	ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(used.Sandboxes), "sandboxes")
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(limits.CPUMilli), "cpu")
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(limits.MemoryMiB), "memory")
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(limits.MaxSandboxes), "sandboxes")
}

// rpcCounter is the Connect interceptor that counts calls by method and
// result.
type rpcCounter struct{ m *metrics }

func (i rpcCounter) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		i.m.rpcs.WithLabelValues(path.Base(req.Spec().Procedure), resultOf(err)).Inc()
		return resp, err
	}
}

func (i rpcCounter) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i rpcCounter) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		i.m.rpcs.WithLabelValues(path.Base(conn.Spec().Procedure), resultOf(err)).Inc()
		return err
	}
}
