package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// Copying response bodies trades memory per open stream against syscalls
// per byte. ReverseProxy holds one copy buffer per response for the
// response's whole life, and most streams (a command's output) are idle
// most of the time, while a file download wants large reads and writes.
// So the buffer ReverseProxy holds is small, and a body that keeps filling
// it borrows a large one for as long as the bytes keep coming (see
// BenchmarkDownload100MB and BenchmarkMemoryPerOpenStream).
const (
	// smallBuffer is held by every open response.
	smallBuffer = 16 << 10
	// largeBuffer is borrowed while a body flows in bulk.
	largeBuffer = 256 << 10
)

var (
	smallBuffers = sync.Pool{New: func() any { b := make([]byte, smallBuffer); return &b }}
	largeBuffers = sync.Pool{New: func() any { b := make([]byte, largeBuffer); return &b }}
)

// bufferPool lends ReverseProxy its (small) copy buffers.
type bufferPool struct{}

func (bufferPool) Get() []byte  { return *smallBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { smallBuffers.Put(&b) }

// streamBody is a response body that, on ReverseProxy's first Read, copies
// itself to the client: each read is written and flushed at once (nothing
// waits), from ReverseProxy's small buffer while reads fit in it and from a
// borrowed large one while they fill it. It then reports EOF, so
// ReverseProxy goes on with trailers as usual. ReverseProxy has already
// written the status and headers when it first reads the body.
type streamBody struct {
	io.ReadCloser
	w      http.ResponseWriter
	fail   func(error) // told why a copy ended before EOF
	copied bool
}

// errClientWrite marks a failure to write to the client, which ReverseProxy
// must treat as the end of the exchange.
var errClientWrite = errors.New("write the response to the client")

func (b *streamBody) Read(p []byte) (int, error) {
	if b.copied || len(p) == 0 {
		return b.ReadCloser.Read(p)
	}
	b.copied = true
	rc := http.NewResponseController(b.w)
	buf := p
	var large *[]byte
	defer func() {
		if large != nil {
			largeBuffers.Put(large)
		}
	}()
	for {
		n, err := b.ReadCloser.Read(buf)
		if n > 0 {
			werr := func() error {
				if _, err := b.w.Write(buf[:n]); err != nil {
					return err
				}
				return rc.Flush()
			}()
			if werr != nil {
				err := errors.Join(errClientWrite, werr)
				b.fail(err)
				return 0, err
			}
		}
		if errors.Is(err, io.EOF) {
			return 0, io.EOF // the whole body went through
		}
		if err != nil {
			b.fail(err)
			return 0, err
		}
		switch {
		case large == nil && n == len(p):
			large = largeBuffers.Get().(*[]byte) // flowing in bulk: read more at once
			buf = *large
		case large != nil && n < len(p):
			largeBuffers.Put(large) // trickling, or about to idle: give it back
			large, buf = nil, p
		}
	}
}

// lockedWriter serializes the writes and flushes of a response, which come
// from streamBody and from ReverseProxy (which flushes the headers from a
// timer of its own when it begins a streamed body). Hijacking and full
// duplex reach the real writer through Unwrap.
type lockedWriter struct {
	http.ResponseWriter
	mu sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ResponseWriter.Write(p)
}

func (l *lockedWriter) WriteHeader(code int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ResponseWriter.WriteHeader(code)
}

// FlushError flushes what was written; http.ResponseController calls it.
func (l *lockedWriter) FlushError() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return http.NewResponseController(l.ResponseWriter).Flush()
}

// Flush is http.Flusher's form of FlushError.
func (l *lockedWriter) Flush() { _ = l.FlushError() }

// Unwrap returns the real writer, for http.ResponseController.
func (l *lockedWriter) Unwrap() http.ResponseWriter { return l.ResponseWriter }
