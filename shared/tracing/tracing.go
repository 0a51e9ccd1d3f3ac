// Package tracing is OpenTelemetry tracing for the Skiff daemons: Setup
// installs W3C trace context propagation always, and exports spans over
// OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set (Enabled). Handler and
// Transport put HTTP servers and clients under spans (otelhttp), so that
// the trace context goes from one daemon to the next in the traceparent
// header; Tracer names a daemon's own spans. With export off the global
// tracer provider stays OpenTelemetry's no-op one (a span of Tracer
// records nothing and costs a context), and Handler and Transport return
// what they were given: a request meets no wrapper at all.
//
// The exporter reads the standard OTEL_* variables itself (endpoint,
// headers, timeout, TLS, compression), the SDK the batch span processor's
// (OTEL_BSP_*) and sampler's (OTEL_TRACES_SAMPLER, default: parent-based
// always-on), and the resource OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. Nothing here is Kubernetes: sandboxd links it.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Environment variables that turn export on.
const (
	EndpointEnv       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	TracesEndpointEnv = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	// disabledEnv "true" turns the SDK off whatever the endpoint says, as
	// the OpenTelemetry specification has it.
	disabledEnv = "OTEL_SDK_DISABLED"
)

// Enabled reports whether the environment asks for spans to be exported:
// an OTLP endpoint is set and the SDK is not disabled.
func Enabled() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv(disabledEnv)), "true") {
		return false
	}
	return os.Getenv(EndpointEnv) != "" || os.Getenv(TracesEndpointEnv) != ""
}

// Setup installs the W3C TraceContext and Baggage propagators and, when
// Enabled, a tracer provider that batches the spans of service (the
// resource's service.name, unless OTEL_SERVICE_NAME says otherwise) to the
// OTLP/HTTP endpoint. The exporter's errors are logged through slog's
// default logger. shutdown flushes what is buffered and stops export,
// within its context's deadline; it is a no-op when export is off.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP/HTTP exporter: %w", err)
	}
	// Ours first, so that OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override it; a conflict of schema URLs is not fatal.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) && !errors.Is(err, resource.ErrSchemaURLConflict) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		slog.Warn("opentelemetry: spans not exported", "error", err)
	}))
	return tp.Shutdown, nil
}

// Tracer is the tracer of a Skiff binary's own spans, named
// github.com/skiff-dev/skiff/<binary>. It follows the global provider, so
// one taken before Setup works after it.
func Tracer(binary string) trace.Tracer {
	return otel.Tracer("github.com/skiff-dev/skiff/" + binary)
}

// Fail records err on span and marks the span failed; a nil err does
// nothing.
func Fail(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// End ends span, first recording *errp on it (Fail); for a defer in a
// function with a named error result.
func End(span trace.Span, errp *error) {
	Fail(span, *errp)
	span.End()
}

// Handler puts every request h serves, or every one that filter (nil:
// all) keeps, under a server span named name(r), a child of the trace
// context the request carries. name must give few distinct names (a route
// pattern, never a path with an ID in it). Unless Enabled, it returns h
// itself: with tracing off a request meets no wrapper at all.
func Handler(h http.Handler, name func(*http.Request) string, filter func(*http.Request) bool) http.Handler {
	if !Enabled() {
		return h
	}
	opts := []otelhttp.Option{otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return name(r) })}
	if filter != nil {
		opts = append(opts, otelhttp.WithFilter(filter))
	}
	return otelhttp.NewHandler(h, "", opts...)
}

// Transport puts every request through base (nil: http.DefaultTransport),
// or every one that filter (nil: all) keeps, under a client span named
// name(r), and sends the span's context in traceparent. It closes base's
// idle connections when asked (http.Client.CloseIdleConnections). Unless
// Enabled, it returns base itself.
func Transport(base http.RoundTripper, name func(*http.Request) string, filter func(*http.Request) bool) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if !Enabled() {
		return base
	}
	opts := []otelhttp.Option{otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return name(r) })}
	if filter != nil {
		opts = append(opts, otelhttp.WithFilter(filter))
	}
	return &transport{Transport: otelhttp.NewTransport(base, opts...), base: base}
}

type transport struct {
	*otelhttp.Transport
	base http.RoundTripper
}

func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Name is a span name that is always the same.
func Name(name string) func(*http.Request) string {
	return func(*http.Request) string { return name }
}

// Attribute keys of Skiff's spans.
const (
	SandboxIDKey = attribute.Key("skiff.sandbox.id")
	TemplateKey  = attribute.Key("skiff.template")
	NodeKey      = attribute.Key("skiff.node")
	TeamKey      = attribute.Key("skiff.team")
)
