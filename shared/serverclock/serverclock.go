// Package serverclock keeps a process's clock in the kube-apiserver's time,
// for the freshness contract (docs/architecture.md): the publisher stamps
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

// auditIDHeader is set by every kube-apiserver on every answer
// (k8s.io/apiserver's audit filter, whether or not auditing is on): an
// answer without it (a load balancer's own error page) is not the
// kube-apiserver's clock.
const auditIDHeader = "Audit-Id"

// Clock is the kube-apiserver's time as this process knows it, learnt from
// the Date header of the kube-apiserver's answers (Wrap).
//
// Each answer bounds the kube-apiserver's time at its arrival: the server
// wrote its Date (whole seconds, rounded down) between the request's send
// and the answer's arrival, so its time at the arrival is in [Date, Date +
// 1 s + the round trip]. The first answer anchors the clock; from then on
// it runs from the anchor on this process's monotonic clock, so that a
// step of the wall clock does not move it. It is anchored again, at the
// interval's middle, when an answer finds it more than Tolerance outside
// that interval; an anchor within Tolerance of this process's wall clock
// is taken as the wall clock itself (a host kept by NTP is not corrected).
// Before any answer it is this process's clock.
type Clock struct {
	now      func() time.Time
	log      *slog.Logger
	onChange func(time.Duration)

	mu sync.Mutex
	// local is a reading of now (with its monotonic reading, from
	// time.Now) and server the kube-apiserver's time then; local is zero
	// before the first answer.
	local, server time.Time
	// corrections counts the anchors that moved the clock.
	corrections uint64
}

// New returns a clock that measures against now (nil: time.Now), logging
// to log (nil: slog.Default) when it corrects this process's clock, and
// calling onChange (may be nil, must not block: the clock is locked) with
// each correction's offset from this process's wall clock.
func New(now func() time.Time, log *slog.Logger, onChange func(time.Duration)) *Clock {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	return &Clock{now: now, log: log, onChange: onChange}
}

// Now is the kube-apiserver's time as this process knows it. It carries no
// monotonic reading: measure durations on a clock of their own.
func (c *Clock) Now() time.Time {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.atLocked(t)
}

// atLocked is the kube-apiserver's time at t, a reading of c.now.
func (c *Clock) atLocked(t time.Time) time.Time {
	if c.local.IsZero() {
		return t.Round(0)
	}
	return c.server.Add(t.Sub(c.local))
}

// Since is Now().Sub(t); with Now, it makes Clock a k8s.io/utils/clock
// PassiveClock.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Offset is what to add to this process's wall clock for the
// kube-apiserver's time, now.
func (c *Clock) Offset() time.Duration {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.atLocked(t).Sub(t.Round(0))
}

// Corrections counts the answers that moved the clock: a caller that read
// Now before a request and finds it changed after may want to read it again.
func (c *Clock) Corrections() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.corrections
}

// Wrap returns rt observing the Date of every answer of a kube-apiserver;
// it fits rest.Config.Wrap.
func (c *Clock) Wrap(rt http.RoundTripper) http.RoundTripper {
	return &observer{c: c, rt: rt}
}

type observer struct {
	c  *Clock
	rt http.RoundTripper
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := o.c.now()
	resp, err := o.rt.RoundTrip(req)
	if err == nil && resp.Header.Get(auditIDHeader) != "" {
		o.c.Observe(sent, o.c.now(), resp.Header.Get("Date"))
	}
	return resp, err
}

// WrappedRoundTripper lets client-go reach the transport below
// (k8s.io/apimachinery's net.RoundTripperWrapper).
func (o *observer) WrappedRoundTripper() http.RoundTripper { return o.rt }

// Observe takes the Date of an answer to a request sent at sent and
// answered at received, readings of the clock New was given. A missing or
// unparsable Date, one outside the years 2000 to 2200 (no kube-apiserver's
// clock), or an answer that came back before it was sent teaches nothing.
func (c *Clock) Observe(sent, received time.Time, date string) {
	rtt := received.Sub(sent)
	if date == "" || rtt < 0 {
		return
	}
	d, err := http.ParseTime(date)
	if err != nil || d.Year() < 2000 || d.Year() > 2200 {
		return
	}
	lo, hi := d, d.Add(time.Second+rtt)
	c.mu.Lock()
	est := c.atLocked(received)
	if !est.Before(lo.Add(-Tolerance)) && !est.After(hi.Add(Tolerance)) {
		if c.local.IsZero() {
			// Agreed: from now on on the monotonic clock.
			c.local, c.server = received, est
		}
		c.mu.Unlock()
		return
	}
	was := est.Sub(received.Round(0))
	c.local, c.server = received, lo.Add((hi.Sub(lo))/2)
	offset := c.server.Sub(received.Round(0))
	if offset >= -Tolerance && offset <= Tolerance {
		c.server, offset = received.Round(0), 0
	}
	c.corrections++
	if c.onChange != nil {
		c.onChange(offset)
	}
	c.mu.Unlock()

	if offset != 0 {
		c.log.Warn("this host's clock is off the kube-apiserver's: the inventories' stamps and their freshness are judged in the kube-apiserver's time (set the host's clock right, by NTP)",
			"offset", offset.Round(time.Millisecond).String(), "was", was.Round(time.Millisecond).String())
	} else {
		c.log.Info("this host's clock agrees with the kube-apiserver's again", "was", was.Round(time.Millisecond).String())
	}
}
