package publish

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skiff-dev/skiff/shared/serverclock"
)

// Metrics are the publisher's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	attempts    *prometheus.CounterVec
	duration    prometheus.Histogram
	lastStamp   prometheus.Gauge
	sandboxes   prometheus.Gauge
	shardWrites prometheus.Counter
	folds       prometheus.Counter
	carried     prometheus.Gauge
	shards      prometheus.Gauge
	// clock is the clock whose offset the clock gauge shows; nil: 0.
	clock atomic.Pointer[serverclock.Clock]
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
		shardWrites: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_shard_writes_total", Help: "NodeInventoryShards written (each a server-side apply of one shard whose sandboxes changed)."}),
		folds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_folds_total", Help: "Publishes that wrote the changes the NodeInventory carried into its shards (past --publish-max-changes, or with nothing newer to publish)."}),
		carried: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_carried_changes", Help: "Changed sandboxes the last NodeInventory written carries in spec.sandboxChanges, not yet in its shards."}),
		shards: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
			Name: "inventory_shards", Help: "NodeInventoryShards the host's sandboxes are split into: --publish-sandbox-shards, or more since a shard would have passed its bounds (4,096 sandboxes, 1 MiB): then raise the flag."}),
	}
	for _, o := range []outcome{written, unchanged, notSynced, failed} {
		m.attempts.WithLabelValues(o.String())
	}
	offset := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "skiff", Subsystem: "vk_sandbox",
		Name: "clock_offset_seconds", Help: "What publishedAt adds to this host's wall clock for the kube-apiserver's time (learnt from its answers' Date; 0 while they agree within a second, and with --publish-server-time=false)."},
		func() float64 {
			if c := m.clock.Load(); c != nil {
				return c.Offset().Seconds()
			}
			return 0
		})
	reg.MustRegister(m.attempts, m.duration, m.lastStamp, m.sandboxes, m.shardWrites, m.folds, m.carried, m.shards, offset)
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

// ShowClock makes the clock offset gauge show c's offset from this host's
// wall clock.
func (m *Metrics) ShowClock(c *serverclock.Clock) {
	if m != nil {
		m.clock.Store(c)
	}
}

// shardsUsed records how many shards the host's sandboxes went to.
func (m *Metrics) shardsUsed(n int) {
	if m != nil {
		m.shards.Set(float64(n))
	}
}

func (m *Metrics) shardWritten() {
	if m != nil {
		m.shardWrites.Inc()
	}
}

// inventoryWritten records a write of the inventory carrying count
// changes, after a fold or not.
func (m *Metrics) inventoryWritten(count int, folded bool) {
	if m == nil {
		return
	}
	m.carried.Set(float64(count))
	if folded {
		m.folds.Inc()
	}
}
