// Package metrics holds sandbox-apiserver's Prometheus metrics, on a
// registry of their own (never the global one): the e2b API's requests by
// route pattern, method and status, their latency by route, creates by
// outcome, and warm-claim conflicts. Labels are closed sets — route
// patterns, methods, status codes, outcomes — never a sandbox ID or a
// team. Every method is safe on a nil *Metrics, which records nothing, so
// the fleet can take one as an optional dependency.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

const (
	namespace = "skiff"
	subsystem = "apiserver"
)

// Outcomes of a create, the outcome label of creates_total.
const (
	OutcomeWarm   = "warm"   // a warm sandbox was claimed
	OutcomeCold   = "cold"   // a sandbox was created cold
	OutcomeFailed = "failed" // no sandbox; the reason label says why
)

// Reasons a create failed, the reason label of creates_total (empty for a
// create that succeeded).
const (
	// ReasonCapacity: no fresh node had the template and room (503).
	ReasonCapacity = "capacity"
	// ReasonInvalid: the request cannot be served as asked — a bad body,
	// an unknown template, a field a host refused, a feature Skiff lacks.
	ReasonInvalid = "invalid"
	// ReasonRateLimited: the team's create rate or sandbox limit (429).
	ReasonRateLimited = "rate_limited"
	// ReasonOther: anything else (a host error, a placement timeout, a
	// client that went away).
	ReasonOther = "other"
)

// RouteUnmatched is the route label of a request that matches no route of
// the e2b API (answered 404 or 405).
const RouteUnmatched = "unmatched"

// createRoutes are the e2b API's create routes, whose requests are counted
// in creates_total.
var createRoutes = map[string]bool{"POST /sandboxes": true, "POST /v2/sandboxes": true}

// Metrics are sandbox-apiserver's metrics. New returns them registered.
type Metrics struct {
	// Registry holds every metric below plus the Go and process collectors;
	// serve's admin listener serves it on /metrics.
	Registry *prometheus.Registry

	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	creates        *prometheus.CounterVec
	claimConflicts prometheus.Counter
}

// New registers the metrics on a new registry.
func New() *Metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts(opts("http_requests_total",
			"Requests to the e2b API by route pattern (\"unmatched\" for none), method and status code (0: the handler gave no answer).")),
			[]string{"route", "method", "code"}),
		// From a list answered from memory (~1 ms) to a create that waits
		// for a cold start and envd (seconds; sandboxd gives up at 30 s).
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "http_request_duration_seconds", Help: "Time to answer a request to the e2b API, by route pattern.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"route"}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts(opts("creates_total",
			"Sandbox creates by outcome (warm, cold, failed) and, for a failure, reason (capacity, invalid, rate_limited, other).")),
			[]string{"outcome", "reason"}),
		claimConflicts: prometheus.NewCounter(prometheus.CounterOpts(opts("warm_claim_conflicts_total",
			"Warm sandboxes a create tried to claim that another claimer had taken first (the host answered that the sandbox was no longer warm or gone)."))),
	}
	// Every create series exists from the start, so that rate() sees its
	// first increment.
	m.creates.WithLabelValues(OutcomeWarm, "")
	m.creates.WithLabelValues(OutcomeCold, "")
	for _, r := range []string{ReasonCapacity, ReasonInvalid, ReasonRateLimited, ReasonOther} {
		m.creates.WithLabelValues(OutcomeFailed, r)
	}
	m.Registry.MustRegister(m.requests, m.duration, m.creates, m.claimConflicts,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// APIKeys adds the api_keys gauge, read from count at each scrape. Call it
// at most once.
func (m *Metrics) APIKeys(count func() int) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "api_keys", Help: "API keys the server accepts (the API-key Secrets in its cache)."},
		func() float64 { return float64(count()) }))
}

// FleetReference adds the fleet_reference_timestamp_seconds gauge, read
// from ref at each scrape (0 while there is none). Call it at most once.
func (m *Metrics) FleetReference(ref func() (time.Time, bool)) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "fleet_reference_timestamp_seconds",
		Help: "The freshness filter's reference: the newest publishedAt of a NodeInventory this replica has seen (capped by its clock). " +
			"time() minus it is how far behind its view of the fleet is: a publish interval normally, more while its watch of the inventories is cut off."},
		func() float64 {
			if at, ok := ref(); ok {
				return float64(at.UnixNano()) / 1e9
			}
			return 0
		}))
}

// WarmPoolLeader adds the warm_pool_leader gauge: 1 while this replica
// holds the warm-pool Lease and drives the pools, read from leading at each
// scrape. Call it at most once.
func (m *Metrics) WarmPoolLeader(leading func() bool) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "warm_pool_leader", Help: "1 while this replica holds the warm-pool Lease and drives the warm pools, else 0."},
		func() float64 {
			if leading() {
				return 1
			}
			return 0
		}))
}

// CreateDone counts a create that reached the fleet: warm or cold when err
// is nil, else failed with err's reason. It marks the request (see
// Instrument) as counted.
func (m *Metrics) CreateDone(ctx context.Context, warm bool, err error) {
	if m == nil {
		return
	}
	if rec, ok := ctx.Value(createKey{}).(*createRecord); ok {
		rec.counted.Store(true)
	}
	switch {
	case err != nil:
		m.creates.WithLabelValues(OutcomeFailed, Reason(err)).Inc()
	case warm:
		m.creates.WithLabelValues(OutcomeWarm, "").Inc()
	default:
		m.creates.WithLabelValues(OutcomeCold, "").Inc()
	}
}

// ClaimConflict counts a warm candidate lost to another claimer.
func (m *Metrics) ClaimConflict() {
	if m == nil {
		return
	}
	m.claimConflicts.Inc()
}

// Reason is the failure reason of a create error, by the e2bapi categories:
// the same classes the API answers with (400 or 501, 503, 429, else).
func Reason(err error) string {
	var inv *e2bapi.InvalidError
	switch {
	case errors.As(err, &inv), errors.Is(err, e2bapi.ErrNotFound), errors.Is(err, e2bapi.ErrUnsupported):
		return ReasonInvalid
	case errors.Is(err, e2bapi.ErrCapacity):
		return ReasonCapacity
	case errors.Is(err, e2bapi.ErrRateLimited):
		return ReasonRateLimited
	}
	return ReasonOther
}

// refusalReason is the failure reason of a create the API answered with
// code before it reached the fleet, and false for an answer that is no
// failed create: a 401 (no team asked) or a success.
func refusalReason(code int) (string, bool) {
	switch {
	case code == http.StatusUnauthorized, code >= 200 && code < 400:
		return "", false
	case code == http.StatusTooManyRequests:
		return ReasonRateLimited, true
	case code == http.StatusServiceUnavailable:
		return ReasonCapacity, true
	case code >= 400 && code < 500, code == http.StatusNotImplemented:
		return ReasonInvalid, true
	}
	return ReasonOther, true
}

// createKey is the context key of a create request's createRecord.
type createKey struct{}

// createRecord tells Instrument whether the fleet counted a create request
// itself; if not, the API refused it first (bad body, unknown template,
// rate limit) and Instrument counts it from the status code.
type createRecord struct{ counted atomic.Bool }

// Instrument counts and times each request next answers, labelled with the
// route pattern route returns for it ("" for none). Create requests that
// never reach the fleet (refused by validation or a rate limit) are counted
// in creates_total here, from their status code; those that reach it are
// counted by CreateDone. On a nil *Metrics it returns next.
func (m *Metrics) Instrument(next http.Handler, route func(*http.Request) string) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		pattern := route(r)
		if pattern == "" {
			pattern = RouteUnmatched
		}
		var rec *createRecord
		if createRoutes[pattern] {
			rec = &createRecord{}
			r = r.WithContext(context.WithValue(r.Context(), createKey{}, rec))
		}
		sw := &statusWriter{ResponseWriter: w}
		returned := false
		defer func() {
			code := sw.status
			if code == 0 && returned {
				code = http.StatusOK // net/http's answer to a handler that wrote nothing
			}
			m.requests.WithLabelValues(pattern, methodLabel(r.Method), codeLabel(code)).Inc()
			m.duration.WithLabelValues(pattern).Observe(time.Since(start).Seconds())
			if rec != nil && !rec.counted.Load() {
				if reason, failed := refusalReason(code); failed {
					m.creates.WithLabelValues(OutcomeFailed, reason).Inc()
				}
			}
		}()
		next.ServeHTTP(sw, r)
		returned = true
	})
}

// methodLabel keeps the method label a closed set: a client may send any
// token as its method.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}

func codeLabel(code int) string {
	if code != 0 && (code < 100 || code > 599) {
		return "other"
	}
	return strconv.Itoa(code)
}

// statusWriter remembers the status of the first header written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
