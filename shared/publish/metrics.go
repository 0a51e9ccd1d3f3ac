package publish

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the publisher's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	attempts  *prometheus.CounterVec
	duration  prometheus.Histogram
	lastStamp prometheus.Gauge
	sandboxes prometheus.Gauge
}

// NewMetrics registers the publisher's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_publishes_total",
			Help: "Publish attempts of the NodeInventory by outcome: written, unchanged (diff before write: not due, nothing changed), not_synced (sandboxd unreachable: no stamp), failed."},
			[]string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_apply_duration_seconds", Help: "Time of one server-side apply of the NodeInventory.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		lastStamp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_published_timestamp_seconds", Help: "The publishedAt of the last NodeInventory written, in Unix seconds."}),
		sandboxes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_sandboxes", Help: "Sandboxes in the last NodeInventory written."}),
	}
	for _, o := range []outcome{written, unchanged, notSynced, failed} {
		m.attempts.WithLabelValues(o.String())
	}
	reg.MustRegister(m.attempts, m.duration, m.lastStamp, m.sandboxes)
	return m
}

func (m *Metrics) attempt(o outcome, took time.Duration) {
	if m == nil {
		return
	}
	m.attempts.WithLabelValues(o.String()).Inc()
	if o == written || o == failed {
		m.duration.Observe(took.Seconds())
	}
}

func (m *Metrics) published(stamp time.Time, sandboxes int) {
	if m == nil {
		return
	}
	m.lastStamp.Set(float64(stamp.Unix()))
	m.sandboxes.Set(float64(sandboxes))
}
