package proxy

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// errBodyIdle is what the transport reads from a request body whose client
// sent nothing for the body idle timeout.
var errBodyIdle = errors.New("the request body sent nothing for the body idle timeout")

// idleBody is a request body that must keep moving. A whole-body deadline
// would cut a long upload or a Connect stream's requests, which may pause
// for the length of a keep-alive interval (50 to 90 s); so each Read may
// wait at most idle for the client, and a body that sends nothing for that
// long fails with errBodyIdle.
//
// It sets the read deadline of the client's connection (HTTP/1.1) or
// stream (HTTP/2) before each Read, and clears it for good once the body
// has ended: Go's HTTP/1.1 server goes on reading the connection after the
// body (to see the client leave), and a deadline left behind would end a
// long answer after the body.
type idleBody struct {
	// The forwarded request's body, never the server's r.Body (see
	// Proxy.watchBody).
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration

	ended   bool        // read only by the transport's goroutine
	timeout atomic.Bool // the handler reads it after the transport failed
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.ended {
		return b.ReadCloser.Read(p)
	}
	if err := b.rc.SetReadDeadline(time.Now().Add(b.idle)); err != nil {
		b.ended = true // this writer has no deadlines: read as it is
	}
	n, err := b.ReadCloser.Read(p)
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
			return n, errBodyIdle
		}
	}
	return n, err
}

// timedOut reports whether the body failed for sending nothing in time.
func (b *idleBody) timedOut() bool { return b != nil && b.timeout.Load() }
