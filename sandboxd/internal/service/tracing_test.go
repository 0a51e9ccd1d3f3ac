package service

import (
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/skiff-dev/skiff/shared/tracing"
)

// A create is the span sandbox.launch in the caller's trace, with a span
// for each step, and envd's /init a client span under envd.init.
func TestCreateSpans(t *testing.T) {
	t.Setenv(tracing.EndpointEnv, "http://127.0.0.1:9") // on, so that envd's client is traced; nothing is exported
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	oldTP, oldProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(oldTP); otel.SetTextMapPropagator(oldProp) })

	h := newHarness(t, harnessConfig{})
	ctx, root := tp.Tracer("test").Start(t.Context(), "root")
	resp, err := h.svc.Create(ctx, createReq())
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.GetSandbox().GetId()

	byName := make(map[string]sdktrace.ReadOnlySpan)
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == root.SpanContext().TraceID() {
			byName[s.Name()] = s
		}
	}
	launch, ok := byName["sandbox.launch"]
	if !ok {
		t.Fatalf("no sandbox.launch span in the caller's trace; spans: %v", names(byName))
	}
	if launch.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Errorf("sandbox.launch is not the caller's span's child")
	}
	attrs := make(map[string]string)
	for _, kv := range launch.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["skiff.sandbox.id"] != id || attrs["skiff.template"] != testTemplate || attrs["skiff.node"] != "test-node" {
		t.Errorf("sandbox.launch attributes %v, want the sandbox %s, its template and node", attrs, id)
	}
	for _, step := range []string{"sandbox.network_setup", "sandbox.runtime_start", "envd.wait_ready", "envd.init"} {
		s, ok := byName[step]
		if !ok {
			t.Errorf("no %s span; spans: %v", step, names(byName))
			continue
		}
		if s.Parent().SpanID() != launch.SpanContext().SpanID() {
			t.Errorf("%s is not sandbox.launch's child", step)
		}
	}
	if s, ok := byName["envd /init"]; !ok || s.Parent().SpanID() != byName["envd.init"].SpanContext().SpanID() {
		t.Errorf("no client span of envd's /init under envd.init; spans: %v", names(byName))
	}
	if _, ok := byName["envd /health"]; ok {
		t.Error("the polls of envd's /health are spans")
	}
}

func names(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	return out
}
