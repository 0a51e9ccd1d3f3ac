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

	"golang.org/x/sys/unix"
)

// Tolerance is how far this process's clock may be from the
// kube-apiserver's before Clock corrects it: a host kept by NTP is never
// corrected, and a corrected clock is within about a second (the Date
// header's resolution) plus half a request's round trip.
const Tolerance = time.Second

// auditIDHeader is set by every kube-apiserver on every answer
// (k8s.io/apiserver's audit filter, whether or not auditing is on): an
// answer without it (a load balancer's own error page) is not the
// kube-apiserver's clock. An aggregated API's answers carry it too, with
// their own server's Date: the clients given a Clock call the
// kube-apiserver's own resources only.
const auditIDHeader = "Audit-Id"

// Clock is the kube-apiserver's time as this process knows it, learnt from
// the Date header of the kube-apiserver's answers (Wrap).
//
// Each answer bounds the kube-apiserver's time at its arrival: the server
// wrote its Date (whole seconds, rounded down) between the request's send
// and the answer's arrival, so its time at the arrival is in [Date, Date +
// 1 s + the round trip]. Before any answer Clock is this process's wall
// clock. The first answer anchors it: at the wall clock when that is
// within Tolerance of the interval (a host kept by NTP is never
// corrected), else at the interval's middle, with a warning. From the
// anchor it runs on a clock that no step of the wall clock moves and that
// counts the time the machine was suspended (CLOCK_BOOTTIME), so that
// neither a wrong step of the wall clock nor the step that sets it right
// moves it, and a suspend does not leave it behind. An answer that finds
// it more than Tolerance outside its interval anchors it again.
type Clock struct {
	now     func() time.Time
	elapsed func() time.Duration
	log     *slog.Logger

	mu       sync.Mutex
	anchored bool
	// at is elapsed() at the anchor and server the kube-apiserver's time
	// then.
	at     time.Duration
	server time.Time
	// corrections counts the anchors that moved the clock.
	corrections uint64
}

// Config is how a Clock reads this process's clocks; the zero Config reads
// the real ones.
type Config struct {
	// Now is the wall clock; nil: time.Now.
	Now func() time.Time
	// Elapsed is a clock that steps of the wall clock do not move and that
	// counts suspends, as a duration since any fixed point; nil: the
	// machine's CLOCK_BOOTTIME with the real Now, and with another Now,
	// Now's readings since New (their monotonic readings, if they carry
	// them).
	Elapsed func() time.Duration
	// Log gets a warning for each correction; nil: slog.Default.
	Log *slog.Logger
}

// New returns a clock as c says.
func New(c Config) *Clock {
	k := &Clock{now: c.Now, elapsed: c.Elapsed, log: c.Log}
	if k.log == nil {
		k.log = slog.Default()
	}
	switch {
	case k.now == nil && k.elapsed == nil:
		k.now, k.elapsed = time.Now, bootTime()
	case k.now == nil:
		k.now = time.Now
	case k.elapsed == nil:
		start := k.now()
		k.elapsed = func() time.Duration { return k.now().Sub(start) }
	}
	return k
}

// bootTime reads CLOCK_BOOTTIME, or Go's monotonic clock where it cannot.
func bootTime() func() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		start := time.Now()
		return func() time.Duration { return time.Since(start) }
	}
	return func() time.Duration {
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
		return time.Duration(ts.Nano())
	}
}

// Now is the kube-apiserver's time as this process knows it. It carries no
// monotonic reading: measure durations on a clock of their own.
func (c *Clock) Now() time.Time {
	t, el := c.now(), c.elapsed()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.atLocked(t, el)
}

// atLocked is the kube-apiserver's time at the wall reading t and elapsed
// reading el, taken together.
func (c *Clock) atLocked(t time.Time, el time.Duration) time.Time {
	if !c.anchored {
		return t.Round(0)
	}
	return c.server.Add(el - c.at)
}

// Since is Now().Sub(t); with Now, it makes Clock a k8s.io/utils/clock
// PassiveClock.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Offset is what to add to this process's wall clock for the
// kube-apiserver's time, now.
func (c *Clock) Offset() time.Duration {
	t, el := c.now(), c.elapsed()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.atLocked(t, el).Sub(t.Round(0))
}

// Anchored reports whether an answer of the kube-apiserver has told the
// clock its time yet.
func (c *Clock) Anchored() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.anchored
}

// Corrections counts the answers that moved the clock (not the first
// anchor at the wall clock): a caller that read Now before a request and
// finds the count changed after may want to read it again.
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
// answered at received, readings of the wall clock (Config.Now), received
// just now. A missing or unparsable Date, one outside the years 2000 to
// 2200 (no kube-apiserver's clock), or an answer that came back before it
// was sent teaches nothing.
func (c *Clock) Observe(sent, received time.Time, date string) {
	el := c.elapsed()
	rtt := received.Sub(sent)
	if date == "" || rtt < 0 {
		return
	}
	d, err := http.ParseTime(date)
	if err != nil || d.Year() < 2000 || d.Year() > 2200 {
		return
	}
	lo, hi := d, d.Add(time.Second+rtt)
	agrees := func(t time.Time) bool { return !t.Before(lo.Add(-Tolerance)) && !t.After(hi.Add(Tolerance)) }
	wall := received.Round(0)
	c.mu.Lock()
	est := c.atLocked(received, el)
	if agrees(est) {
		if !c.anchored {
			// The wall clock agrees: from now on it runs on elapsed.
			c.anchored, c.at, c.server = true, el, wall
		}
		c.mu.Unlock()
		return
	}
	was := est.Sub(wall)
	c.anchored, c.at, c.server = true, el, lo.Add(hi.Sub(lo)/2)
	if agrees(wall) {
		// The wall clock was set right (or this clock had drifted).
		c.server = wall
	}
	c.corrections++
	offset := c.server.Sub(wall)
	c.mu.Unlock()

	if offset != 0 {
		c.log.Warn("this host's clock is off the kube-apiserver's: the inventories' stamps and their freshness are judged in the kube-apiserver's time (set the host's clock right, by NTP)",
			"offset", offset.Round(time.Millisecond).String(), "was", was.Round(time.Millisecond).String())
	} else {
		c.log.Info("this host's clock agrees with the kube-apiserver's again", "was", was.Round(time.Millisecond).String())
	}
}
