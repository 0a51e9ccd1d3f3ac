// Package serverclock keeps a process's clock in the kube-apiserver's time,
// for the freshness contract (docs/scaling-design.md): the publisher stamps
// publishedAt by it, and the readers cap their reference by it, so that a
// host or a reader whose own clock is off neither drops live hosts nor
// keeps dead ones.
//
// Readers compare the hosts' stamps with each other. A host whose clock ran
// behind the others by more than the readers' stale window would never
// count as live, and one whose clock ran ahead would stay live that much
// longer after it died; a reader whose clock ran behind would keep a dead
// host that much longer. With every stamp and every cap in one clock,
// none does.
package serverclock

import (
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Tolerance is how far this process's clock may be from the
// kube-apiserver's before Clock corrects it: a host kept by NTP is never
// corrected, and a corrected clock is within about a second (the Date
// header's resolution) plus half a request's round trip.
const Tolerance = time.Second

// Clock learns how far this process's clock is from the kube-apiserver's,
// from the Date header of the kube-apiserver's responses (Wrap).
//
// Each response bounds the offset: the server wrote its Date (whole
// seconds, rounded down) between the request's send and the response's
// arrival, so the offset is in [Date − arrival, Date + 1 s − send]. The
// offset stays while it is within Tolerance of that interval and moves to
// the interval's middle when it is not (to 0 when that is within
// Tolerance). It starts at 0.
type Clock struct {
	now      func() time.Time
	log      *slog.Logger
	onChange func(time.Duration)

	mu     sync.Mutex
	offset time.Duration
}

// New returns a clock at offset 0 that measures against now (nil:
// time.Now), logging to log (nil: slog.Default) when it corrects this
// process's clock, and calling onChange (may be nil) with each new offset.
func New(now func() time.Time, log *slog.Logger, onChange func(time.Duration)) *Clock {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	return &Clock{now: now, log: log, onChange: onChange}
}

// Offset is what to add to this process's clock for the kube-apiserver's.
func (c *Clock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}

// Now is the kube-apiserver's time as this process knows it. It keeps the
// monotonic reading of the clock it measures against, if any.
func (c *Clock) Now() time.Time { return c.now().Add(c.Offset()) }

// Since is Now().Sub(t); with Now, it makes Clock a k8s.io/utils/clock
// PassiveClock.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Wrap returns rt observing every response's Date; it fits
// rest.Config.Wrap.
func (c *Clock) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		sent := c.now()
		resp, err := rt.RoundTrip(req)
		if err == nil {
			c.Observe(sent, c.now(), resp.Header.Get("Date"))
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// Observe takes the Date of a response to a request sent at sent and
// answered at received, by this process's clock. A missing or unparsable
// Date, or a response that came back before it was sent (the clock
// stepped meanwhile), teaches nothing.
func (c *Clock) Observe(sent, received time.Time, date string) {
	if date == "" || received.Before(sent) {
		return
	}
	d, err := http.ParseTime(date)
	if err != nil {
		return
	}
	lo := d.Sub(received)
	hi := d.Add(time.Second).Sub(sent)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.offset >= lo-Tolerance && c.offset <= hi+Tolerance {
		return
	}
	was := c.offset
	c.offset = lo + (hi-lo)/2
	if c.offset >= -Tolerance && c.offset <= Tolerance {
		c.offset = 0
	}
	if c.onChange != nil {
		c.onChange(c.offset)
	}
	if c.offset != 0 {
		c.log.Warn("this host's clock is off the kube-apiserver's: the inventories' stamps and their freshness are judged in the kube-apiserver's time (set the host's clock right, by NTP)",
			"offset", c.offset.Round(time.Millisecond).String(), "was", was.Round(time.Millisecond).String())
	} else {
		c.log.Info("this host's clock agrees with the kube-apiserver's again", "was", was.Round(time.Millisecond).String())
	}
}
