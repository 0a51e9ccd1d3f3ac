package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{e2bapi.Invalid("templateID", "no such template"), ReasonInvalid},
		{fmt.Errorf("create: %w", e2bapi.ErrNotFound), ReasonInvalid},
		{fmt.Errorf("create: %w", e2bapi.ErrUnsupported), ReasonInvalid},
		{fmt.Errorf("create: %w: no node", e2bapi.ErrCapacity), ReasonCapacity},
		{fmt.Errorf("%w: the team has 3 sandboxes", e2bapi.ErrRateLimited), ReasonRateLimited},
		{fmt.Errorf("%w: slow", e2bapi.ErrPlacementTimeout), ReasonOther},
		{context.Canceled, ReasonOther},
		{errors.New("boom"), ReasonOther},
	} {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// Instrument labels requests by the route pattern it is given, bounds the
// method and code labels, and counts the creates that never reached the
// fleet from their status — and only those.
func TestInstrument(t *testing.T) {
	m := New()
	// The handler answers with the status in the X-Status header; with
	// X-Fleet it is a create the fleet counted (a cold one).
	h := m.Instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fleet") != "" {
			m.CreateDone(r.Context(), false, nil)
		}
		switch s := r.Header.Get("X-Status"); s {
		case "":
			// nothing written: net/http answers 200
		case "1000":
			w.WriteHeader(http.StatusContinue) // an informational header first
			w.WriteHeader(1000)
		default:
			var code int
			_, _ = fmt.Sscan(s, &code)
			w.WriteHeader(code)
		}
	}), func(r *http.Request) string {
		switch r.URL.Path {
		case "/v2/sandboxes":
			return "POST /v2/sandboxes"
		case "/sandboxes/abc":
			return "GET /sandboxes/{id}"
		}
		return ""
	})
	for _, tc := range []struct {
		method, path, status string
		fleet                bool
	}{
		{http.MethodGet, "/sandboxes/abc", "", false},
		{http.MethodGet, "/sandboxes/abc", "404", false},
		{"BREW", "/sandboxes/abc", "1000", false},
		{http.MethodGet, "/nope", "404", false},
		{http.MethodPost, "/v2/sandboxes", "201", true},  // counted by the fleet
		{http.MethodPost, "/v2/sandboxes", "503", true},  // counted by the fleet (as cold here), not again
		{http.MethodPost, "/v2/sandboxes", "400", false}, // refused before the fleet
		{http.MethodPost, "/v2/sandboxes", "429", false},
		{http.MethodPost, "/v2/sandboxes", "503", false},
		{http.MethodPost, "/v2/sandboxes", "501", false},
		{http.MethodPost, "/v2/sandboxes", "500", false},
		{http.MethodPost, "/v2/sandboxes", "401", false}, // no team: no create
	} {
		r := httptest.NewRequest(tc.method, "http://api"+tc.path, nil)
		if tc.status != "" {
			r.Header.Set("X-Status", tc.status)
		}
		if tc.fleet {
			r.Header.Set("X-Fleet", "1")
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	want := `
# HELP skiff_apiserver_creates_total Sandbox creates by outcome (warm, cold, failed) and, for a failure, reason (capacity, invalid, rate_limited, other).
# TYPE skiff_apiserver_creates_total counter
skiff_apiserver_creates_total{outcome="cold",reason=""} 2
skiff_apiserver_creates_total{outcome="failed",reason="capacity"} 1
skiff_apiserver_creates_total{outcome="failed",reason="invalid"} 2
skiff_apiserver_creates_total{outcome="failed",reason="other"} 1
skiff_apiserver_creates_total{outcome="failed",reason="rate_limited"} 1
skiff_apiserver_creates_total{outcome="warm",reason=""} 0
# HELP skiff_apiserver_http_requests_total Requests to the e2b API by route pattern ("unmatched" for none), method and status code (0: the handler gave no answer).
# TYPE skiff_apiserver_http_requests_total counter
skiff_apiserver_http_requests_total{code="200",method="GET",route="GET /sandboxes/{id}"} 1
skiff_apiserver_http_requests_total{code="404",method="GET",route="GET /sandboxes/{id}"} 1
skiff_apiserver_http_requests_total{code="other",method="other",route="GET /sandboxes/{id}"} 1
skiff_apiserver_http_requests_total{code="404",method="GET",route="unmatched"} 1
skiff_apiserver_http_requests_total{code="201",method="POST",route="POST /v2/sandboxes"} 1
skiff_apiserver_http_requests_total{code="400",method="POST",route="POST /v2/sandboxes"} 1
skiff_apiserver_http_requests_total{code="401",method="POST",route="POST /v2/sandboxes"} 1
skiff_apiserver_http_requests_total{code="429",method="POST",route="POST /v2/sandboxes"} 1
skiff_apiserver_http_requests_total{code="500",method="POST",route="POST /v2/sandboxes"} 1
skiff_apiserver_http_requests_total{code="501",method="POST",route="POST /v2/sandboxes"} 1
skiff_apiserver_http_requests_total{code="503",method="POST",route="POST /v2/sandboxes"} 2
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"skiff_apiserver_creates_total", "skiff_apiserver_http_requests_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(m.Registry, "skiff_apiserver_http_request_duration_seconds"); err != nil || n != 3 {
		t.Errorf("duration histograms = %d, %v; want one per route (3)", n, err)
	}
}

// A handler that panics is counted with code 0, and the panic goes on.
func TestInstrumentPanic(t *testing.T) {
	m := New()
	h := m.Instrument(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }),
		func(*http.Request) string { return "GET /health" })
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked as is
				t.Errorf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "http://api/health", nil))
	}()
	want := `
# HELP skiff_apiserver_http_requests_total Requests to the e2b API by route pattern ("unmatched" for none), method and status code (0: the handler gave no answer).
# TYPE skiff_apiserver_http_requests_total counter
skiff_apiserver_http_requests_total{code="0",method="GET",route="GET /health"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "skiff_apiserver_http_requests_total"); err != nil {
		t.Error(err)
	}
}

// Every method is a no-op on a nil *Metrics.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.CreateDone(t.Context(), true, nil)
	m.ClaimConflict()
	m.APIKeys(func() int { return 1 })
	next := http.NotFoundHandler()
	if h := m.Instrument(next, func(*http.Request) string { return "" }); fmt.Sprint(h) != fmt.Sprint(next) {
		t.Errorf("Instrument on nil = %v, want next itself", h)
	}
}

func TestAPIKeys(t *testing.T) {
	m := New()
	n := 3
	m.APIKeys(func() int { return n })
	want := `
# HELP skiff_apiserver_api_keys API keys the server accepts (the API-key Secrets in its cache).
# TYPE skiff_apiserver_api_keys gauge
skiff_apiserver_api_keys 3
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "skiff_apiserver_api_keys"); err != nil {
		t.Error(err)
	}
}
