package serverclock

import (
	"net/http"
	"testing"
	"time"
)

// fakeClock is a clock the test moves (its readings carry no monotonic
// reading, so the clock's arithmetic is on their wall readings).
type fakeClock struct{ t time.Time }

func (f *fakeClock) now() time.Time { return f.t }

func TestClock(t *testing.T) {
	local := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	var changes []time.Duration
	c := New(local.now, nil, func(d time.Duration) { changes = append(changes, d) })
	// respond tells c of an answer sent now, taking rtt, from a server
	// whose clock is the local one plus skew, dated half way.
	respond := func(skew, rtt time.Duration) {
		sent := local.t
		c.Observe(sent, sent.Add(rtt), sent.Add(rtt/2).Add(skew).UTC().Format(http.TimeFormat))
		local.t = sent.Add(rtt)
	}
	within := func(got, want, by time.Duration) bool { return got-want >= -by && got-want <= by }

	if got := c.Now(); !got.Equal(local.t) {
		t.Fatalf("before any answer, Now = %s, want this clock's %s", got, local.t)
	}
	for range 20 {
		respond(300*time.Millisecond, 20*time.Millisecond)
		local.t = local.t.Add(137 * time.Millisecond)
		if got := c.Offset(); got != 0 {
			t.Fatalf("a clock 300ms off moved the offset to %s: within the tolerance it stays 0", got)
		}
	}
	skew := -3 * time.Minute
	respond(skew, 20*time.Millisecond)
	first := c.Offset()
	if !within(first, skew, time.Second) || c.Corrections() != 1 {
		t.Fatalf("offset %s after %d corrections, for a clock %s off", first, c.Corrections(), -skew)
	}
	// Later answers agree with it, give or take their second: it holds,
	// and it runs with this process's clock.
	for i := range 50 {
		local.t = local.t.Add(173 * time.Millisecond)
		respond(skew, time.Duration(i)*time.Millisecond)
		if got := c.Offset(); got != first {
			t.Fatalf("answer %d moved the offset from %s to %s", i, first, got)
		}
	}
	if got, want := c.Now(), local.t.Add(first); !got.Equal(want) {
		t.Fatalf("Now = %s, want %s", got, want)
	}
	// What teaches nothing: no Date, a bad one, one from no
	// kube-apiserver's years, an answer before its request.
	c.Observe(local.t, local.t, "")
	c.Observe(local.t, local.t, "yesterday")
	c.Observe(local.t, local.t, time.Date(1990, 1, 1, 0, 0, 0, 0, time.UTC).Format(http.TimeFormat))
	c.Observe(local.t, local.t.Add(-time.Minute), local.t.UTC().Format(http.TimeFormat))
	if got := c.Offset(); got != first || c.Corrections() != 1 {
		t.Fatalf("offset moved to %s (%d corrections)", got, c.Corrections())
	}
	// The host's clock is set right: back to it.
	respond(0, 20*time.Millisecond)
	if got := c.Offset(); got != 0 || c.Corrections() != 2 {
		t.Fatalf("offset %s after %d corrections, once the clock was set right", got, c.Corrections())
	}
	// A slow answer bounds the offset loosely; the middle is taken.
	respond(time.Hour, 10*time.Second)
	if got := c.Offset(); !within(got, time.Hour, 6*time.Second) {
		t.Fatalf("offset %s for a clock an hour behind, answered in 10s", got)
	}
	if len(changes) != 3 || changes[1] != 0 {
		t.Errorf("onChange was called with %v, want the three corrections", changes)
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
	c := New(nil, nil, nil)
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
