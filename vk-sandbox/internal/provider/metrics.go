package provider

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the provider's Prometheus metrics; labels are closed sets
// (Connect codes, reasons), never a pod or sandbox name. A nil *Metrics
// records nothing.
type Metrics struct {
	creates        *prometheus.CounterVec
	createDuration prometheus.Histogram
	kills          *prometheus.CounterVec
	ends           *prometheus.CounterVec
	released       prometheus.Counter
	orphaned       prometheus.Gauge
}

// NewMetrics registers the provider's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "skiff", Subsystem: "vk_sandbox", Name: name, Help: help}
	}
	m := &Metrics{
		creates: prometheus.NewCounterVec(prometheus.CounterOpts(opts("pod_sandbox_creates_total",
			"Sandboxes created for pods, by result (ok or sandboxd's Connect code).")), []string{"result"}),
		createDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "pod_sandbox_create_duration_seconds", Help: "Time of sandboxd's Create for a pod, envd ready included.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		kills: prometheus.NewCounterVec(prometheus.CounterOpts(opts("pod_sandbox_kills_total",
			"Kills of pods' sandboxes, by result (ok or sandboxd's Connect code).")), []string{"result"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts(opts("pod_sandbox_ends_total",
			"Pods whose sandbox ended (or never started), by reason.")), []string{"reason"}),
		released: prometheus.NewCounter(prometheus.CounterOpts(opts("pod_sandboxes_released_total",
			"Pods evicted for their node's health whose sandboxes were left running."))),
		orphaned: prometheus.NewGauge(prometheus.GaugeOpts(opts("orphan_sandboxes",
			"Sandboxes linked to a pod that no longer exists, left to run to their deadline."))),
	}
	reg.MustRegister(m.creates, m.createDuration, m.kills, m.ends, m.released, m.orphaned)
	return m
}

func (m *Metrics) created(result string, took time.Duration) {
	if m == nil {
		return
	}
	m.creates.WithLabelValues(result).Inc()
	m.createDuration.Observe(took.Seconds())
}

func (m *Metrics) killed(result string) {
	if m != nil {
		m.kills.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) ended(reason string) {
	if m != nil {
		m.ends.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) releasedOne() {
	if m != nil {
		m.released.Inc()
	}
}

func (m *Metrics) orphans(n int) {
	if m != nil {
		m.orphaned.Set(float64(n))
	}
}
