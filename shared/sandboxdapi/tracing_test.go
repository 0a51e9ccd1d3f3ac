package sandboxdapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/tracing"
)

func TestSpanName(t *testing.T) {
	for path, want := range map[string]string{
		"/skiff.sandboxd.v1.SandboxdService/Create": "skiff.sandboxd.v1.SandboxdService/Create",
		"/skiff.sandboxd.v1.SandboxdService/Watch":  "skiff.sandboxd.v1.SandboxdService/Watch",
		"/skiff.sandboxd.v1.SandboxdService/Nope":   "HTTP POST",
		"/a/b/sbx-123": "HTTP POST",
	} {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		if got := sandboxdapi.SpanName(r); got != want {
			t.Errorf("SpanName(%s) = %q, want %q", path, got, want)
		}
	}
	for path, want := range map[string]bool{
		"/skiff.sandboxd.v1.SandboxdService/Create": true,
		"/skiff.sandboxd.v1.SandboxdService/Watch":  false,
	} {
		if got := sandboxdapi.Traced(httptest.NewRequest(http.MethodPost, path, nil)); got != want {
			t.Errorf("Traced(%s) = %v, want %v", path, got, want)
		}
	}
}

// With tracing on, a call is under a client span of the caller's trace,
// which the server gets in traceparent.
func TestClientsPropagate(t *testing.T) {
	t.Setenv(tracing.EndpointEnv, "http://127.0.0.1:1") // on; nothing is exported here
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	oldTP, oldProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(oldTP); otel.SetTextMapPropagator(oldProp) })

	var (
		mu      sync.Mutex
		parents []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents = append(parents, r.Header.Get("Traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	c := sandboxdapi.NewClients("s3cret", srv.Client())(strings.TrimPrefix(srv.URL, "http://"))

	ctx, root := tp.Tracer("test").Start(t.Context(), "root")
	_, _ = c.Info(ctx, connect.NewRequest(&sandboxdv1.InfoRequest{}))
	root.End()
	mu.Lock()
	defer mu.Unlock()
	if len(parents) != 1 || !strings.Contains(parents[0], root.SpanContext().TraceID().String()) {
		t.Fatalf("server saw traceparent %q, want one in trace %s", parents, root.SpanContext().TraceID())
	}
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	if !strings.Contains(strings.Join(names, ","), "skiff.sandboxd.v1.SandboxdService/Info") {
		t.Errorf("ended spans %v, want the Info call's", names)
	}
}
