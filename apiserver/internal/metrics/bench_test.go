package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkInstrument is what counting and timing add to one request: the
// route lookup is the caller's, here a constant.
func BenchmarkInstrument(b *testing.B) {
	m := New()
	h := m.Instrument(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
		func(*http.Request) string { return "GET /v2/sandboxes" })
	r := httptest.NewRequest(http.MethodGet, "http://api/v2/sandboxes", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}
