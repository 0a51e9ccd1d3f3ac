package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/skiff-dev/skiff/shared/tracing"
)

// tracingFlushTimeout bounds the export of the last spans on shutdown.
const tracingFlushTimeout = 5 * time.Second

// Tracing sets up OpenTelemetry for the daemon named service
// (tracing.Setup: export only when OTEL_EXPORTER_OTLP_ENDPOINT is set) and
// returns what the daemon defers: it flushes the spans still buffered
// within a few seconds, logging a failure. It logs where spans go.
func Tracing(ctx context.Context, log *slog.Logger, service string) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, service)
	if err != nil {
		return nil, err
	}
	if tracing.Enabled() {
		log.InfoContext(ctx, "exporting traces over OTLP/HTTP", "service", service)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("flush traces on shutdown", "error", err)
		}
	}, nil
}
