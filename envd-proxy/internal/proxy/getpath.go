package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// getPath sends plain GETs (see plainGET) to sandboxd on keep-alive
// connections of its own. http.Transport never lends out its connection,
// so a download through it costs two copies in the proxy; here, a response
// whose Content-Length is above spliceAbove gets a spliceBody: streamBody
// hands its socket to the client writer's ReadFrom, and net/http splices
// it into the client's TCP connection. Other bodies are read through a
// larger buffer than http.Transport's (readBuffer). On the loopback test
// machine, splicing cost as much CPU as copying, and the larger buffer
// paid only when sandboxd sent faster than the client read
// (BenchmarkDownload100MB): so getPath is off by default.
//
// What it does as http.Transport does: the same request bytes (req.Write),
// response parsing (http.ReadResponse, chunked bodies and trailers
// included), 1xx responses handed to the client trace (ReverseProxy
// forwards them), a 10 MB bound on response headers, a retry on another
// connection when a reused one fails before any byte of the answer (a GET
// is idempotent; sandboxd may have closed it while idle), the request's
// context closing the connection, and a connection reused only after its
// body was read to the end and neither side asked to close. Idle
// connections follow TransportOptions. It has no goroutine per connection.
type getPath struct {
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	received    prometheus.Counter // bytes spliced from sandboxd; nil: not counted
	bufSize     int
	spliceAbove int64
	maxIdle     int
	idleTimeout time.Duration
	writers     sync.Pool    // *bufio.Writer of bufSize, lent while a request is written
	readers     sync.Pool    // *bufio.Reader of readBuffer, lent for an exchange
	spliced     atomic.Int64 // bodies handed to sendTo (for tests)

	mu   sync.Mutex
	idle map[string][]*upConn // by host:port, most recently used last
}

const (
	// maxResponseHeaderBytes is http.Transport's default bound.
	maxResponseHeaderBytes = 10 << 20
	// readBuffer is the read buffer an exchange borrows, from its request
	// until its body ends; an idle connection holds none. Larger than
	// http.Transport's 16 KiB so that a read takes whole chunks of a
	// chunked body (sandboxd's relay sends 32 KiB ones) and, when several
	// are already there, the chunked reader hands them to one write to the
	// client.
	readBuffer = 64 << 10
)

// upConn is one connection to a sandboxd.
type upConn struct {
	g      *getPath
	addr   string
	conn   net.Conn         // requests and headers go through it (counted)
	tcp    *net.TCPConn     // the same socket, for splice; nil if not TCP
	lim    io.LimitedReader // conn; bounded while headers are read
	br     *bufio.Reader    // over lim, during an exchange
	reused bool             // it served a request before
	timer  *time.Timer      // closes it when idle too long
}

func (g *getPath) roundTrip(req *http.Request) (*http.Response, error) {
	addr := hostPort(req.URL)
	for {
		c, err := g.conn(req.Context(), addr)
		if err != nil {
			return nil, err
		}
		resp, retry, err := c.roundTrip(req)
		if err == nil || !retry || !c.reused {
			return resp, err
		}
		// A reused connection that sandboxd had closed: try the next one.
	}
}

// hostPort is u's host with the port HTTP implies when it names none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// conn returns an idle connection to addr, or dials one.
func (g *getPath) conn(ctx context.Context, addr string) (*upConn, error) {
	if c := g.takeIdle(addr); c != nil {
		return c, nil
	}
	nc, err := g.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &upConn{g: g, addr: addr, conn: nc, tcp: tcpConn(nc)}
	c.lim.R = nc
	return c, nil
}

// roundTrip sends req on c and reads the answer's headers. On an error c
// is closed, and retry tells whether sandboxd got nothing of the request
// or answered nothing, so the request may go on another connection.
func (c *upConn) roundTrip(req *http.Request) (_ *http.Response, retry bool, err error) {
	ctx := req.Context()
	stop := context.AfterFunc(ctx, func() { _ = c.conn.Close() }) // unblocks any read or write on c
	if br, _ := c.g.readers.Get().(*bufio.Reader); br != nil {
		br.Reset(&c.lim)
		c.br = br
	} else {
		c.br = bufio.NewReaderSize(&c.lim, readBuffer)
	}
	defer func() {
		if err != nil {
			c.release(stop, false)
			if ctx.Err() != nil {
				err, retry = fmt.Errorf("%w (%w)", ctx.Err(), err), false
			}
		}
	}()

	bw, _ := c.g.writers.Get().(*bufio.Writer)
	if bw == nil {
		bw = bufio.NewWriterSize(c.conn, c.g.bufSize)
	} else {
		bw.Reset(c.conn)
	}
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	c.g.writers.Put(bw)
	if err != nil {
		return nil, true, err
	}

	c.lim.N = maxResponseHeaderBytes
	trace := httptrace.ContextClientTrace(ctx)
	var resp *http.Response
	for informational := false; ; informational = true {
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			nothing := !informational && c.lim.N == maxResponseHeaderBytes
			if c.lim.N <= 0 {
				err = fmt.Errorf("sandboxd's response headers exceed %d bytes", maxResponseHeaderBytes)
			}
			return nil, nothing, err
		}
		code := resp.StatusCode
		if code < 100 || code > 199 {
			break
		}
		if code == http.StatusSwitchingProtocols {
			return nil, false, errors.New("sandboxd switched protocols on a request that asked for no upgrade")
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err = trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return nil, false, err
			}
			c.lim.N = maxResponseHeaderBytes // the client bounds those it was shown
		}
	}
	c.lim.N = math.MaxInt64

	keep := !resp.Close && !req.Close
	switch {
	case resp.Body == http.NoBody:
		c.release(stop, keep)
	case resp.ContentLength > c.g.spliceAbove && len(resp.TransferEncoding) == 0 && c.tcp != nil:
		resp.Body = &spliceBody{bodyEnd: bodyEnd{c: c, stop: stop, keep: keep}, remaining: resp.ContentLength}
	default:
		resp.Body = &connBody{src: resp.Body, bodyEnd: bodyEnd{c: c, stop: stop, keep: keep}}
	}
	return resp, false, nil
}

// release ends c's exchange and gives back its read buffer: c goes back
// to the idle pool if reuse and nothing else is pending on it, and is
// closed otherwise. stop unregisters the request context's hook; if that
// hook already ran, c is closed.
func (c *upConn) release(stop func() bool, reuse bool) {
	reuse = stop() && reuse && c.br.Buffered() == 0
	c.br.Reset(nil)
	c.g.readers.Put(c.br)
	c.br = nil
	if reuse {
		c.reused = true
		c.g.putIdle(c)
		return
	}
	_ = c.conn.Close()
}

// alive reports whether sandboxd's side of c still works, with a read that
// cannot block. After a splice failed, it tells a client that went away (c
// alive: sandboxd has more to send, or waits) from sandboxd failing.
func (c *upConn) alive() bool {
	if c.tcp.SetReadDeadline(time.Now()) != nil {
		return false
	}
	var b [1]byte
	n, err := c.tcp.Read(b[:])
	return n > 0 || errors.Is(err, os.ErrDeadlineExceeded)
}

func (g *getPath) takeIdle(addr string) *upConn {
	g.mu.Lock()
	defer g.mu.Unlock()
	for conns := g.idle[addr]; len(conns) > 0; {
		c := conns[len(conns)-1]
		conns[len(conns)-1] = nil
		conns = conns[:len(conns)-1]
		if len(conns) == 0 {
			delete(g.idle, addr)
		} else {
			g.idle[addr] = conns
		}
		if c.timer.Stop() {
			return c
		}
		// Its idle timer fired: expire closes it.
	}
	return nil
}

func (g *getPath) putIdle(c *upConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.idle[c.addr]) >= g.maxIdle {
		_ = c.conn.Close()
		return
	}
	g.idle[c.addr] = append(g.idle[c.addr], c)
	if c.timer == nil {
		c.timer = time.AfterFunc(g.idleTimeout, func() { g.expire(c) })
	} else {
		c.timer.Reset(g.idleTimeout)
	}
}

// expire closes c, idle too long, and takes it out of the pool.
func (g *getPath) expire(c *upConn) {
	g.mu.Lock()
	conns := g.idle[c.addr]
	for i, ic := range conns {
		if ic == c {
			conns = append(conns[:i], conns[i+1:]...)
			if len(conns) == 0 {
				delete(g.idle, c.addr)
			} else {
				g.idle[c.addr] = conns
			}
			break
		}
	}
	g.mu.Unlock()
	_ = c.conn.Close()
}

func (g *getPath) closeIdle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for addr, conns := range g.idle {
		for _, c := range conns {
			c.timer.Stop()
			_ = c.conn.Close()
		}
		delete(g.idle, addr)
	}
}

// errBodyClosed is what a read after Close gets, as from http.Transport.
var errBodyClosed = errors.New("http: read on closed response body")

// bodyEnd releases a body's connection once: for reuse after the whole
// body was read, closed on an error or an early Close. A body's Read and
// Close must not run concurrently (ReverseProxy calls them in turn); the
// request's context, which closes the connection, may end at any time.
type bodyEnd struct {
	c    *upConn
	stop func() bool
	keep bool  // neither side asked to close the connection
	err  error // once set, the connection is released and every Read returns it
}

// end records how the body ended (io.EOF: complete) and releases the
// connection.
func (e *bodyEnd) end(err error) {
	if e.err == nil {
		e.err = err
		complete := err == io.EOF //nolint:errorlint // only a bare io.EOF is a whole body; a wrapped one is not
		e.c.release(e.stop, e.keep && complete)
	}
}

// Close ends the body; before its end, that closes the connection (it
// does not drain the rest, as ReadResponse's body would).
func (e *bodyEnd) Close() error {
	e.end(errBodyClosed)
	return nil
}

// connBody is a body of getPath other than a spliceBody: ReadResponse's
// own (chunked, small, or of unknown length).
type connBody struct {
	bodyEnd
	src io.ReadCloser
}

func (b *connBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.src.Read(p)
	if err != nil {
		b.end(err) // a chunked or sized body cut short is io.ErrUnexpectedEOF, not io.EOF
	}
	return n, err
}

// spliceBody is a body of known length above spliceAbove, read straight
// from the connection: first what the read buffer already holds, then the
// socket itself (sendTo).
type spliceBody struct {
	bodyEnd
	remaining int64
}

func (b *spliceBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.remaining == 0 {
		b.end(io.EOF)
		return 0, io.EOF
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.c.br.Read(p) // a read as large as the buffer bypasses it
	b.remaining -= int64(n)
	switch {
	case b.remaining == 0:
		err = io.EOF
	case errors.Is(err, io.EOF):
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.end(err)
	}
	return n, err
}

// sendTo writes the rest of the body to the client: the buffered bytes
// with w.Write, then the socket through rf.ReadFrom, which splices it when
// rf is net/http's writer on a plain TCP connection. The body is then at
// its end. A body that sandboxd ends early is io.ErrUnexpectedEOF; a
// failure to write to the client is marked with errClientWrite.
func (b *spliceBody) sendTo(w io.Writer, rf io.ReaderFrom) error {
	if b.err != nil {
		return b.err
	}
	b.c.g.spliced.Add(1)
	if k := min(int64(b.c.br.Buffered()), b.remaining); k > 0 {
		p, _ := b.c.br.Peek(int(k)) // cannot fail: k bytes are buffered
		n, err := w.Write(p)
		_, _ = b.c.br.Discard(n)
		b.remaining -= int64(n)
		if err != nil {
			err = errors.Join(errClientWrite, err)
			b.end(err)
			return err
		}
	}
	if b.remaining > 0 {
		lr := &io.LimitedReader{R: b.c.tcp, N: b.remaining}
		_, err := rf.ReadFrom(lr)
		if b.c.g.received != nil {
			b.c.g.received.Add(float64(b.remaining - lr.N)) // bytes that reached the client
		}
		b.remaining = lr.N
		switch {
		case err == nil && b.remaining > 0:
			err = fmt.Errorf("sandboxd ended the body %d bytes short: %w", b.remaining, io.ErrUnexpectedEOF)
		case err != nil && b.c.alive():
			err = errors.Join(errClientWrite, err)
		}
		if err != nil {
			b.end(err)
			return err
		}
	}
	b.end(io.EOF)
	return nil
}
