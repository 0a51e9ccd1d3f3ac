package serverclock

import (
	"net/http"
	"testing"
	"time"
)

func TestServerClockOffset(t *testing.T) {
	base := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	date := func(server time.Time) string { return server.UTC().Format(http.TimeFormat) }
	var changes []time.Duration
	c := New(nil, nil, func(d time.Duration) { changes = append(changes, d) })
	// observe is told the local send and arrival; the server's clock is
	// the local one plus skew, and it answered half way.
	respond := func(skew time.Duration, local time.Time, rtt time.Duration) {
		c.Observe(local, local.Add(rtt), date(local.Add(rtt/2).Add(skew)))
	}
	for i := range 20 {
		respond(300*time.Millisecond, base.Add(time.Duration(i)*137*time.Millisecond), 20*time.Millisecond)
		if got := c.Offset(); got != 0 {
			t.Fatalf("a clock 300ms off moved the offset to %s: within the tolerance it stays 0", got)
		}
	}
	skew := -3 * time.Minute
	respond(skew, base, 20*time.Millisecond)
	first := c.Offset()
	if d := first - skew; d < -time.Second || d > time.Second {
		t.Fatalf("offset %s for a clock %s off", first, -skew)
	}
	// Later answers agree with it, give or take their second: it holds.
	for i := range 50 {
		respond(skew, base.Add(time.Duration(i)*173*time.Millisecond), time.Duration(i)*time.Millisecond)
		if got := c.Offset(); got != first {
			t.Fatalf("answer %d moved the offset from %s to %s", i, first, got)
		}
	}
	// What teaches nothing: no Date, a bad one, an answer before its
	// request (the local clock stepped back).
	c.Observe(base, base, "")
	c.Observe(base, base, "yesterday")
	c.Observe(base, base.Add(-time.Minute), date(base))
	if got := c.Offset(); got != first {
		t.Fatalf("offset moved to %s", got)
	}
	// The host's clock is set right: back to 0.
	respond(0, base, 20*time.Millisecond)
	if got := c.Offset(); got != 0 {
		t.Fatalf("offset %s after the clock was set right", got)
	}
	// A slow answer bounds the offset loosely; the middle is taken.
	respond(time.Hour, base, 10*time.Second)
	if d := c.Offset() - time.Hour; d < -6*time.Second || d > 6*time.Second {
		t.Fatalf("offset %s for a clock an hour behind, answered in 10s", c.Offset())
	}
	if len(changes) != 3 {
		t.Errorf("onChange was called with %v, want the three changes", changes)
	}
}
