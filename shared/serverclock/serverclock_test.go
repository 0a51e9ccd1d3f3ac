package serverclock

import (
	"net/http"
	"testing"
	"time"
)

// machine is a machine's clocks as a test moves them: the wall clock and
// one that counts elapsed time (CLOCK_BOOTTIME), which a step of the wall
// clock does not move.
type machine struct {
	wall    time.Time
	elapsed time.Duration
}

func (m *machine) now() time.Time           { return m.wall }
func (m *machine) sinceBoot() time.Duration { return m.elapsed }

// pass moves both clocks by d.
func (m *machine) pass(d time.Duration) {
	m.wall = m.wall.Add(d)
	m.elapsed += d
}

func TestClock(t *testing.T) {
	m := &machine{wall: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC), elapsed: time.Hour}
	c := New(Config{Now: m.now, Elapsed: m.sinceBoot})
	// respond tells c of an answer to a request sent now, taking rtt,
	// from a server whose clock is the wall clock plus skew, dated half
	// way.
	respond := func(skew, rtt time.Duration) {
		sent := m.wall
		date := m.wall.Add(skew).Add(rtt / 2).UTC().Format(http.TimeFormat)
		m.pass(rtt)
		c.Observe(sent, m.wall, date)
	}
	within := func(got, want, by time.Duration) bool { return got-want >= -by && got-want <= by }

	if got := c.Now(); !got.Equal(m.wall) {
		t.Fatalf("before any answer, Now = %s, want the wall clock's %s", got, m.wall)
	}
	for range 20 {
		respond(300*time.Millisecond, 20*time.Millisecond)
		m.pass(137 * time.Millisecond)
		if got := c.Offset(); got != 0 || c.Corrections() != 0 {
			t.Fatalf("a clock 300ms off moved the offset to %s: within the tolerance it stays 0", got)
		}
	}

	// The wall clock is stepped 3 minutes ahead, wrongly: Now does not
	// move until an answer says so, and that answer does not move it.
	m.wall = m.wall.Add(3 * time.Minute)
	if got := c.Offset(); !within(got, -3*time.Minute, 0) {
		t.Fatalf("a step of the wall clock moved Now: offset %s, want -3m", got)
	}
	respond(-3*time.Minute, 20*time.Millisecond)
	if got := c.Offset(); !within(got, -3*time.Minute, 0) || c.Corrections() != 0 {
		t.Fatalf("offset %s after %d corrections; the answer agreed with Now", got, c.Corrections())
	}
	// It is stepped back right: Now still does not move.
	m.wall = m.wall.Add(-3 * time.Minute)
	if got := c.Offset(); got != 0 {
		t.Fatalf("offset %s after the wall clock was set right", got)
	}

	// A process that started with its clock 3 minutes slow.
	m2 := &machine{wall: m.wall, elapsed: time.Hour}
	c2 := New(Config{Now: m2.now, Elapsed: m2.sinceBoot})
	skew := 3 * time.Minute
	sent := m2.wall
	m2.pass(20 * time.Millisecond)
	c2.Observe(sent, m2.wall, m2.wall.Add(skew).UTC().Format(http.TimeFormat))
	first := c2.Offset()
	if !within(first, skew, time.Second) || c2.Corrections() != 1 {
		t.Fatalf("offset %s after %d corrections, for a clock %s slow", first, c2.Corrections(), skew)
	}
	// Later answers agree with it, give or take their second: it holds,
	// and it runs with the machine's clocks.
	for i := range 50 {
		m2.pass(173 * time.Millisecond)
		sent := m2.wall
		rtt := time.Duration(i) * time.Millisecond
		date := m2.wall.Add(skew).Add(rtt / 2).UTC().Format(http.TimeFormat)
		m2.pass(rtt)
		c2.Observe(sent, m2.wall, date)
		if got := c2.Offset(); got != first {
			t.Fatalf("answer %d moved the offset from %s to %s", i, first, got)
		}
	}
	// A suspend: both clocks move on.
	m2.pass(10 * time.Minute)
	if got := c2.Offset(); got != first {
		t.Fatalf("offset %s after a suspend, want %s", got, first)
	}
	// What teaches nothing: no Date, a bad one, one from no
	// kube-apiserver's years, an answer before its request.
	c2.Observe(m2.wall, m2.wall, "")
	c2.Observe(m2.wall, m2.wall, "yesterday")
	c2.Observe(m2.wall, m2.wall, time.Date(1990, 1, 1, 0, 0, 0, 0, time.UTC).Format(http.TimeFormat))
	c2.Observe(m2.wall, m2.wall.Add(-time.Minute), m2.wall.UTC().Format(http.TimeFormat))
	if got := c2.Offset(); got != first || c2.Corrections() != 1 {
		t.Fatalf("offset moved to %s (%d corrections)", got, c2.Corrections())
	}
	// The kube-apiserver's clock is stepped to this one's: back to it.
	sent = m2.wall
	m2.pass(20 * time.Millisecond)
	c2.Observe(sent, m2.wall, m2.wall.UTC().Format(http.TimeFormat))
	if got := c2.Offset(); got != 0 || c2.Corrections() != 2 {
		t.Fatalf("offset %s after %d corrections, once the clocks agree", got, c2.Corrections())
	}
	// A slow answer bounds the offset loosely; the middle is taken.
	sent = m2.wall
	m2.pass(10 * time.Second)
	c2.Observe(sent, m2.wall, sent.Add(time.Hour+5*time.Second).UTC().Format(http.TimeFormat))
	if got := c2.Offset(); !within(got, time.Hour, 6*time.Second) {
		t.Fatalf("offset %s for a clock an hour behind, answered in 10s", got)
	}
}

// roundTrip answers every request with header.
type roundTrip http.Header

func (h roundTrip) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header(h), Body: http.NoBody}, nil
}

// roundTripOnce sends req through rt and closes the answer.
func roundTripOnce(t *testing.T, rt http.RoundTripper, req *http.Request) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
}

// Only a kube-apiserver's answers (with an Audit-Id) tell the clock.
func TestWrapObservesTheKubeAPIServersAnswers(t *testing.T) {
	date := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	c := New(Config{})
	req, err := http.NewRequest(http.MethodGet, "https://127.0.0.1:1/version", nil)
	if err != nil {
		t.Fatal(err)
	}
	roundTripOnce(t, c.Wrap(roundTrip{"Date": {date}}), req)
	if c.Corrections() != 0 {
		t.Fatalf("an answer without Audit-Id corrected the clock to %s", c.Offset())
	}
	rt := roundTrip{"Date": {date}, "Audit-Id": {"b7f6"}}
	wrapped := c.Wrap(rt)
	roundTripOnce(t, wrapped, req)
	if got := c.Offset(); got < time.Hour-2*time.Second || got > time.Hour+time.Second {
		t.Fatalf("offset %s after a kube-apiserver an hour ahead answered", got)
	}
	if w, ok := wrapped.(interface{ WrappedRoundTripper() http.RoundTripper }); !ok || w.WrappedRoundTripper() == nil {
		t.Errorf("the wrapper hides the transport below it")
	}
}
