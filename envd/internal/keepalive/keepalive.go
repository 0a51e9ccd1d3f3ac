// Package keepalive reads how often a stream must show signs of life: e2b's
// SDKs send Keepalive-Ping-Interval (seconds) on every stream, and envd sends
// a keepalive event after each such interval without other events, so that
// proxies and load balancers keep idle streams open.
package keepalive

import (
	"net/http"
	"strconv"
	"time"
)

// Header is the request header that carries the interval in seconds.
const Header = "Keepalive-Ping-Interval"

// Default is the interval for a request without the header, as in e2b's envd.
const Default = 90 * time.Second

// Interval returns the request's interval: a positive number of seconds
// (fractions allowed, at most a day), else Default.
func Interval(h http.Header) time.Duration {
	v, err := strconv.ParseFloat(h.Get(Header), 64)
	if err != nil || !(v > 0) || v > 86400 {
		return Default
	}
	return time.Duration(v * float64(time.Second))
}
