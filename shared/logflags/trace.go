package logflags

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Keys under which a record logged in a span's context carries the span.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// WithTraceIDs wraps h so that a record logged with a context that holds
// a valid span (an OpenTelemetry span context, sampled or not) gets the
// span's trace_id and span_id, hex as in traceparent, after its own
// attributes (inside the logger's groups, if it has any). Records without
// one pass unchanged.
func WithTraceIDs(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r = r.Clone()
			r.AddAttrs(slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
