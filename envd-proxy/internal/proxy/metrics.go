package proxy

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/skiff-dev/skiff/envd-proxy/internal/route"
)

const (
	metricsNamespace = "skiff"
	metricsSubsystem = "envd_proxy"
)

// Stream kinds, a metric label.
const (
	kindHTTP    = "http"
	kindUpgrade = "upgrade"
)

// Metrics are the proxy's Prometheus metrics, on a registry of their own.
// Labels are closed sets (how a request was routed, its status code, a
// direction): never a sandbox ID or a node.
type Metrics struct {
	// Registry holds every metric below plus the Go and process collectors.
	Registry *prometheus.Registry

	requests        *prometheus.CounterVec
	upstreamLatency prometheus.Histogram
	openStreams     *prometheus.GaugeVec
	openHTTP        prometheus.Gauge
	openUpgrade     prometheus.Gauge
	bytes           *prometheus.CounterVec
	toSandbox       prometheus.Counter
	fromSandbox     prometheus.Counter
	refreshes       *prometheus.CounterVec
	refreshDuration prometheus.Histogram
	fleetNodes      prometheus.Gauge
	tokenRoutes     prometheus.GaugeFunc
}

// NewMetrics registers the metrics; tokens (may be nil) feeds the
// token_routes gauge.
func NewMetrics(tokens *route.Tokens) *Metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help}
	}
	hist := func(name, help string, buckets []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help, Buckets: buckets}
	}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total",
			"Requests by how they named their sandbox (header, host, token, none) and the status code the client got "+
				"(0: the client went away before an answer).")), []string{"routed_by", "code"}),
		upstreamLatency: prometheus.NewHistogram(hist("upstream_latency_seconds",
			"Time from forwarding a request to sandboxd to its response headers (auto-resume included).",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30})),
		openStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("open_streams",
			"Requests being proxied now, by kind (http, upgrade: WebSocket and other upgraded connections).")), []string{"kind"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts(opts("bytes_total",
			"Bytes on the connections to sandboxd, HTTP framing included, by direction (to_sandbox, from_sandbox).")), []string{"direction"}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts(opts("index_refreshes_total",
			"Rebuilds of the routing index from the fleet's fresh inventories, by result (ok, error).")), []string{"result"}),
		refreshDuration: prometheus.NewHistogram(hist("index_refresh_duration_seconds",
			"Time to rebuild the routing index.", []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1})),
		fleetNodes: prometheus.NewGauge(prometheus.GaugeOpts(opts("fleet_nodes",
			"Fresh nodes in the routing index."))),
		tokenRoutes: prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("token_routes",
			"Access tokens the proxy can route by (bounded by --token-routes).")), func() float64 { return float64(tokens.Len()) }),
	}
	m.toSandbox = m.bytes.WithLabelValues("to_sandbox")
	m.fromSandbox = m.bytes.WithLabelValues("from_sandbox")
	m.openHTTP = m.openStreams.WithLabelValues(kindHTTP)
	m.openUpgrade = m.openStreams.WithLabelValues(kindUpgrade)
	m.Registry.MustRegister(m.requests, m.upstreamLatency, m.openStreams, m.bytes, m.refreshes, m.refreshDuration,
		m.fleetNodes, m.tokenRoutes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveRefresh records one rebuild of the routing index (fleet.Options
// OnRefresh).
func (m *Metrics) ObserveRefresh(took time.Duration, nodes int, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.refreshes.WithLabelValues(result).Inc()
	m.refreshDuration.Observe(took.Seconds())
	m.fleetNodes.Set(float64(nodes))
}

// request counts one finished request.
func (m *Metrics) request(by route.By, status int) {
	code := strconv.Itoa(status)
	if status != 0 && (status < 100 || status > 599) {
		code = "other" // a sandbox's service may answer anything: keep the set closed
	}
	m.requests.WithLabelValues(string(by), code).Inc()
}
