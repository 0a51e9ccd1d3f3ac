// Package idlebody puts a proxied request's body under an idle timeout in
// place of the server's whole-request read timeout, which would cut a long
// upload or a Connect stream's requests (they may pause for the length of
// a keep-alive interval): each read may wait at most the idle time for the
// client, and a body that sends nothing for that long fails with ErrIdle.
//
// It sets the read deadline of the client's connection (HTTP/1.1) or
// stream (HTTP/2) before each read, and clears it for good once the body
// has ended: Go's HTTP/1.1 server goes on reading the connection after the
// body (to see the client leave), and a deadline left behind would end a
// long answer after the body.
//
// Wrap the outgoing request's body (httputil.ProxyRequest.Out.Body), never
// the server's r.Body: the server decides from r.Body's type whether a
// connection whose body was left unread may serve another request, and
// with r.Body replaced an upload answered early (a 401, a 413) would leave
// its connection open and the rest of its body be read as new requests.
package idlebody

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// ErrIdle is what a read of a body whose client sent nothing for the idle
// timeout fails with.
var ErrIdle = errors.New("the request body sent nothing for the body idle timeout")

// Body is a request body that must keep moving.
type Body struct {
	rc   *http.ResponseController
	idle time.Duration
	in   io.ReadCloser

	ended   bool // read only by the goroutine that reads the body
	timeout atomic.Bool
	broken  atomic.Bool
}

// Watch puts r's body under idle, from now: the first deadline is set at
// once, so it also bounds what the server drains of the body after an
// answer given without reading it. It returns nil when r has no body, idle
// is not positive, or w's connection takes no deadlines (the server's own
// bounds then stay).
func Watch(w http.ResponseWriter, r *http.Request, idle time.Duration) *Body {
	if idle <= 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b := &Body{rc: http.NewResponseController(w), idle: idle}
	if err := b.rc.SetReadDeadline(time.Now().Add(idle)); err != nil {
		return nil
	}
	return b
}

// Wrap makes b read from in (the outgoing request's body) and returns b,
// to be the outgoing request's body in its place.
func (b *Body) Wrap(in io.ReadCloser) io.ReadCloser {
	b.in = in
	return b
}

// Read implements io.Reader.
func (b *Body) Read(p []byte) (int, error) {
	if b.ended {
		return b.in.Read(p)
	}
	if err := b.rc.SetReadDeadline(time.Now().Add(b.idle)); err != nil {
		b.ended = true // this writer has no deadlines: read as it is
	}
	n, err := b.in.Read(p)
	if err != nil && !b.ended {
		b.ended = true
		switch {
		case errors.Is(err, io.EOF):
			_ = b.rc.SetReadDeadline(time.Time{})
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The deadline stays: the server's drain of the rest of the
			// body after the answer fails at once, and the connection
			// closes.
			b.timeout.Store(true)
			return n, ErrIdle
		default:
			b.broken.Store(true)
		}
	}
	return n, err
}

// Close implements io.Closer.
func (b *Body) Close() error { return b.in.Close() }

// TimedOut reports whether the body failed for sending nothing in time.
func (b *Body) TimedOut() bool { return b != nil && b.timeout.Load() }

// Broken reports whether reading the body failed otherwise: the client
// went away, or its body broke off.
func (b *Body) Broken() bool { return b != nil && b.broken.Load() }
