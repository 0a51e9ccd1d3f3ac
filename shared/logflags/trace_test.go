package logflags

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func spanContext(t *testing.T, sampled bool) context.Context {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	if err != nil {
		t.Fatal(err)
	}
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid}
	if sampled {
		cfg.TraceFlags = trace.FlagsSampled
	}
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(cfg))
}

func TestWithTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(WithTraceIDs(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	line := func() map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
			t.Fatalf("not one JSON line: %q", buf.String())
		}
		buf.Reset()
		return m
	}

	log.InfoContext(spanContext(t, true), "in a span", "k", "v")
	m := line()
	if m[TraceIDKey] != "4bf92f3577b34da6a3ce929d0e0e4736" || m[SpanIDKey] != "00f067aa0ba902b7" {
		t.Errorf("in a span: trace_id %v, span_id %v; want the span's", m[TraceIDKey], m[SpanIDKey])
	}
	if m["k"] != "v" || m["component"] != "test" {
		t.Errorf("in a span: lost the record's own attributes: %v", m)
	}

	// An unsampled span still names its trace: the ID is what finds the
	// request's lines, whether or not its spans were kept.
	log.InfoContext(spanContext(t, false), "unsampled")
	if m := line(); m[TraceIDKey] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("unsampled: trace_id %v, want the span's", m[TraceIDKey])
	}

	for name, ctx := range map[string]context.Context{
		"no span":      context.Background(),
		"invalid span": trace.ContextWithSpanContext(context.Background(), trace.SpanContext{}),
	} {
		log.InfoContext(ctx, "outside")
		if m := line(); m[TraceIDKey] != nil || m[SpanIDKey] != nil {
			t.Errorf("%s: got trace_id %v, span_id %v; want none", name, m[TraceIDKey], m[SpanIDKey])
		}
	}
	log.Info("no context")
	if m := line(); m[TraceIDKey] != nil {
		t.Errorf("no context: got trace_id %v", m[TraceIDKey])
	}

	// A group keeps the wrapper: the IDs go in it, as every attribute does.
	log.WithGroup("g").InfoContext(spanContext(t, true), "grouped")
	if g, _ := line()["g"].(map[string]any); g == nil || g[TraceIDKey] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("grouped: trace_id not in group g")
	}
}

// The logger of the flags carries the IDs in either format.
func TestLoggerHasTraceIDs(t *testing.T) {
	for _, format := range []string{Text, JSON} {
		o := New(format)
		var buf bytes.Buffer
		log, err := o.Logger(&buf)
		if err != nil {
			t.Fatal(err)
		}
		log.InfoContext(spanContext(t, true), "request")
		if !strings.Contains(buf.String(), "4bf92f3577b34da6a3ce929d0e0e4736") {
			t.Errorf("%s: no trace_id in %q", format, buf.String())
		}
	}
}

// A record the wrapper adds to is a clone: a handler that keeps the
// record it was given (a test recorder, a buffering handler) sees it
// unchanged when the next one is logged.
func TestWithTraceIDsDoesNotShareRecords(t *testing.T) {
	keep := &keeper{}
	log := slog.New(WithTraceIDs(keep))
	log.InfoContext(spanContext(t, true), "a", "a1", 1, "a2", 2, "a3", 3, "a4", 4, "a5", 5, "a6", 6)
	log.InfoContext(spanContext(t, true), "b", "b1", 1)
	if len(keep.records) != 2 {
		t.Fatalf("kept %d records", len(keep.records))
	}
	var keys []string
	keep.records[0].Attrs(func(a slog.Attr) bool { keys = append(keys, a.Key); return true })
	if want := "a1 a2 a3 a4 a5 a6 trace_id span_id"; strings.Join(keys, " ") != want {
		t.Errorf("first record's attributes %v, want %s", keys, want)
	}
}

type keeper struct{ records []slog.Record }

func (k *keeper) Enabled(context.Context, slog.Level) bool { return true }
func (k *keeper) Handle(_ context.Context, r slog.Record) error {
	k.records = append(k.records, r)
	return nil
}
func (k *keeper) WithAttrs([]slog.Attr) slog.Handler { return k }
func (k *keeper) WithGroup(string) slog.Handler      { return k }
