package cli

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/egressproxy"
)

// lockedBuffer is a bytes.Buffer that the filters' goroutines may log to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A deliberate stop of the egress filters logs nothing: when sandboxd's
// start failed after they started (a bad --envd), the three of them logged
// "egress filter stopped … use of closed network connection" as errors
// above the real failure, since their sockets closed while they ran. They
// now stop first, and so they do at shutdown (ctx ended).
func TestEgressFiltersStopQuietly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shutdown bool
	}{{"start failed", false}, {"shutdown", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var logs lockedBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			fl, err := listenEgress(0, 0)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			fl.serve(ctx, egressproxy.Options{
				Sandboxes: egressproxy.NewSandboxes(),
				Permitted: func(netip.Addr) bool { return false },
				Resolvers: func() []netip.Addr { return nil },
				Logger:    log,
			})
			if tc.shutdown {
				cancel()
			}
			fl.close()
			time.Sleep(300 * time.Millisecond) // time for the line of a filter that did not stop
			if s := logs.String(); s != "" {
				t.Errorf("stopping the egress filters logged:\n%s", s)
			}
		})
	}
}
