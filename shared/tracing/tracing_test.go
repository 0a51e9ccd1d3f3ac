package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP receiver: the service names and span names
// of what it was sent, by trace ID.
type collector struct {
	mu    sync.Mutex
	spans map[string][]string // trace ID (hex) -> "service/span"
}

func newCollector(t *testing.T) (*collector, string) {
	c := &collector{spans: make(map[string][]string)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			var service string
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					id := trace.TraceID(s.GetTraceId()).String()
					c.spans[id] = append(c.spans[id], service+"/"+s.GetName())
				}
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

func (c *collector) trace(id string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.spans[id]...)
}

// restoreGlobals puts the global provider and propagator back after the
// test.
func restoreGlobals(t *testing.T) {
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(tp); otel.SetTextMapPropagator(prop) })
}

func TestSetupOff(t *testing.T) {
	restoreGlobals(t)
	t.Setenv(EndpointEnv, "")
	t.Setenv(TracesEndpointEnv, "")
	shutdown, err := Setup(t.Context(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider); sdk {
		t.Error("an SDK tracer provider is installed with no endpoint set")
	}
	_, span := Tracer("test").Start(t.Context(), "s")
	if span.IsRecording() {
		t.Error("a span records with tracing off")
	}
	span.End()
	// The propagator is W3C's either way.
	// The composite propagator's Fields comes from a map: compare as a set.
	fields := otel.GetTextMapPropagator().Fields()
	slices.Sort(fields)
	if want := []string{"baggage", "traceparent", "tracestate"}; !slices.Equal(fields, want) {
		t.Errorf("propagator fields %v, want %v", fields, want)
	}
	// Handler and Transport are their arguments: nothing runs per request.
	mux := http.NewServeMux()
	if got := Handler(mux, Name("x"), nil); got != http.Handler(mux) {
		t.Errorf("Handler wrapped h with tracing off: %T", got)
	}
	base := &http.Transport{}
	if got := Transport(base, Name("x"), nil); got != base {
		t.Errorf("Transport wrapped base with tracing off: %T", got)
	}
}

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		endpoint, traces, disabled string
		want                       bool
	}{
		{"", "", "", false},
		{"http://127.0.0.1:4318", "", "", true},
		{"", "http://127.0.0.1:4318/v1/traces", "", true},
		{"http://127.0.0.1:4318", "", "true", false},
		{"http://127.0.0.1:4318", "", "false", true},
	} {
		t.Setenv(EndpointEnv, tc.endpoint)
		t.Setenv(TracesEndpointEnv, tc.traces)
		t.Setenv(disabledEnv, tc.disabled)
		if got := Enabled(); got != tc.want {
			t.Errorf("Enabled() with %q, %q, disabled %q = %v, want %v", tc.endpoint, tc.traces, tc.disabled, got, tc.want)
		}
	}
}

// A request from a Transport to a Handler is one trace: the client's span
// and the server's (and one the server starts) reach the collector under
// one trace ID, with the service's name.
func TestExportAndPropagate(t *testing.T) {
	restoreGlobals(t)
	c, url := newCollector(t)
	t.Setenv(EndpointEnv, url)
	t.Setenv(TracesEndpointEnv, "")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
	shutdown, err := Setup(t.Context(), "test-service")
	if err != nil {
		t.Fatal(err)
	}
	tracer := Tracer("test")

	var serverTrace string
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, span := tracer.Start(r.Context(), "work")
		serverTrace = span.SpanContext().TraceID().String()
		span.End()
		_, _ = io.WriteString(w, r.Header.Get("Traceparent"))
	}), func(r *http.Request) string { return r.Method + " /thing" }, func(r *http.Request) bool { return r.URL.Path != "/skip" }))
	defer srv.Close()
	client := &http.Client{Transport: Transport(nil, Name("call"), nil)}

	ctx, root := tracer.Start(t.Context(), "root")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/thing/123", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	root.End()
	want := root.SpanContext().TraceID().String()
	if len(got) == 0 || serverTrace != want {
		t.Fatalf("the server got traceparent %q and its span trace %s, want trace %s", got, serverTrace, want)
	}

	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	spans := c.trace(want)
	for _, name := range []string{"test-service/root", "test-service/call", "test-service/GET /thing", "test-service/work"} {
		found := false
		for _, s := range spans {
			found = found || s == name
		}
		if !found {
			t.Errorf("trace %s lacks span %s; it has %v", want, name, spans)
		}
	}
	client.CloseIdleConnections()
}

// The propagator Setup installs reads what Transport writes.
func TestPropagatorRoundTrip(t *testing.T) {
	restoreGlobals(t)
	t.Setenv(EndpointEnv, "")
	if _, err := Setup(t.Context(), "x"); err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	ctx := otel.GetTextMapPropagator().Extract(t.Context(), propagation.HeaderCarrier(h))
	if sc := trace.SpanContextFromContext(ctx); sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsRemote() {
		t.Errorf("extracted %v", sc)
	}
}
