// Package logs writes envd's log: JSON lines on stdout, one object per line,
// which sandboxd parses for its Logs API. docs/envd.md defines the format:
//
//	{"time":"<RFC3339Nano, UTC>","source":"envd"|"stdout"|"stderr","line":"…", …}
//
// envd's own lines (source envd) come through log/slog and carry a level and
// attributes; the output lines of processes (source stdout or stderr) carry
// the process's pid. Two budgets bound what one envd writes in its lifetime:
// the output lines stop at Config.OutputLimit bytes, everything at
// Config.Limit bytes, each with one line saying so.
//
// Nothing here knows what a token or an environment variable is: callers
// must never pass secrets, environment values or file contents.
package logs

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Source is a line's "source": who wrote it.
type Source string

// The sources of lines.
const (
	Envd   Source = "envd"
	Stdout Source = "stdout"
	Stderr Source = "stderr"
)

// MaxLine is the most bytes of one output line that are logged; a longer
// line is cut there and marked "truncated":true.
const MaxLine = 4 << 10

// MaxRecord is the most bytes one envd line may take, JSON and newline
// included; a longer one is replaced by a line saying it was dropped. Output
// lines stay below it by construction (MaxLine bytes, at most six bytes of
// JSON each).
const MaxRecord = 64 << 10

// Default budgets.
const (
	DefaultOutputLimit = 16 << 20
	DefaultLimit       = 64 << 20
)

// Config is what the log writes and how much.
type Config struct {
	// Output logs the output lines of processes.
	Output bool
	// OutputLimit is the most bytes of output lines (JSON included) written
	// in envd's lifetime.
	OutputLimit int64
	// Limit is the most bytes of all lines written in envd's lifetime.
	Limit int64
	// Level is the least level of envd's own lines.
	Level slog.Level
}

// Log is envd's log. It is safe for concurrent use.
type Log struct {
	logger *slog.Logger
	output atomic.Bool // output lines are still logged

	mu          sync.Mutex
	w           io.Writer
	limit, used int64
	stopped     bool // Limit was reached
	outLimit    int64
	outUsed     int64
	out         []byte // lines to write, in one write
	scratch     []byte // one line being encoded
	now         func() time.Time
	// last is the time of the last line written: each write's lines are
	// later (stampLocked), so that the file is in time order, which
	// sandboxd's reader bisects by and pages on.
	last time.Time
}

// New returns a log writing to w, which should be a file opened with
// O_APPEND: a write blocks the process output being logged.
func New(w io.Writer, c Config) *Log {
	if c.OutputLimit <= 0 {
		c.OutputLimit = DefaultOutputLimit
	}
	if c.Limit <= 0 {
		c.Limit = DefaultLimit
	}
	l := &Log{w: w, limit: c.Limit, outLimit: c.OutputLimit, now: time.Now}
	l.output.Store(c.Output)
	h := slog.NewJSONHandler(envdWriter{l}, &slog.HandlerOptions{Level: c.Level, ReplaceAttr: replaceAttr})
	l.logger = slog.New(h.WithAttrs([]slog.Attr{slog.String("source", string(Envd))}))
	return l
}

// Discard is a log that writes nothing, for tests and embedders.
func Discard() *Log { return New(io.Discard, Config{}) }

// Logger is the logger of envd's own lines (source envd). The message is the
// line; attributes become fields.
func (l *Log) Logger() *slog.Logger { return l.logger }

// replaceAttr shapes slog's JSON into envd's: time in RFC 3339 with
// nanoseconds in UTC, and the message as "line".
func replaceAttr(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		if t, ok := a.Value.Any().(time.Time); ok {
			return slog.String(slog.TimeKey, t.UTC().Format(time.RFC3339Nano))
		}
	case slog.MessageKey:
		a.Key = "line"
	}
	return a
}

// stampLocked is the time of a write of lines stamped t: t, or just after
// the last write's when t is not later. A record's time is taken before
// the log's lock, and two writes may take the same instant; a write's
// lines after another's must not be earlier, nor at its time (a reader
// paging by time would take them for lines it had).
func (l *Log) stampLocked(t time.Time) time.Time {
	t = t.UTC()
	if !t.After(l.last) {
		t = l.last.Add(time.Nanosecond)
	}
	l.last = t
	return t
}

// timePrefix starts every JSON line: the time is its first field.
const timePrefix = `{"time":"`

// restampLocked gives a line slog encoded (its time first) the time
// stampLocked says, rewriting it into l.scratch when that differs.
func (l *Log) restampLocked(p []byte) []byte {
	rest, ok := bytes.CutPrefix(p, []byte(timePrefix))
	end := bytes.IndexByte(rest, '"')
	if !ok || end < 0 {
		return p
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:end]))
	if err != nil {
		return p
	}
	if st := l.stampLocked(t); !st.Equal(t) {
		b := l.scratch[:0]
		b = append(b, timePrefix...)
		b = st.AppendFormat(b, time.RFC3339Nano)
		b = append(b, rest[end:]...)
		l.scratch = b
		return b
	}
	return p
}

// envdWriter receives one whole JSON line per Write from slog's handler.
type envdWriter struct{ l *Log }

func (w envdWriter) Write(p []byte) (int, error) {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	p = l.restampLocked(p)
	if len(p) > MaxRecord {
		l.addLocked(l.noticeLocked(slog.LevelWarn, fmt.Sprintf("log line of %d bytes dropped: the most is %d", len(p), MaxRecord)))
	} else {
		l.addLocked(p)
	}
	l.flushLocked()
	return n, nil
}

// addLocked queues one line within the total budget; the first line past it
// is replaced by a notice, and nothing follows.
func (l *Log) addLocked(p []byte) {
	if l.stopped {
		return
	}
	if l.used+int64(len(p)) > l.limit {
		l.stopped = true
		l.output.Store(false)
		p = l.noticeLocked(slog.LevelWarn, fmt.Sprintf("logging stopped: the log limit of %d bytes is reached", l.limit))
	}
	l.used += int64(len(p))
	l.out = append(l.out, p...)
}

// flushLocked writes the queued lines at once: whole lines in one write(2),
// which an O_APPEND file never interleaves with another's.
func (l *Log) flushLocked() {
	if len(l.out) == 0 {
		return
	}
	_, _ = l.w.Write(l.out)
	l.out = l.out[:0]
	if cap(l.out) > 1<<20 {
		l.out = nil
	}
}

// noticeLocked encodes an envd line written outside slog, so that it can be
// written while l.mu is held, into l.scratch.
func (l *Log) noticeLocked(level slog.Level, msg string) []byte {
	b := l.scratch[:0]
	b = append(b, timePrefix...)
	b = l.stampLocked(l.now()).AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"`...)
	b = append(b, level.String()...)
	b = append(b, `","line":`...)
	b = appendString(b, msg)
	b = append(b, `,"source":"envd"}`+"\n"...)
	l.scratch = b
	return b
}

// OutputEnabled reports whether output lines are still logged.
func (l *Log) OutputEnabled() bool { return l.output.Load() }

// writeOutput logs the lines of one output stream, in one write.
func (l *Log) writeOutput(w *Lines) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.stampLocked(l.now())
	for _, pl := range w.pending {
		if !l.output.Load() {
			break
		}
		b := l.scratch[:0]
		b = append(b, timePrefix...)
		b = now.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","source":"`...)
		b = append(b, w.source...)
		b = append(b, `","pid":`...)
		b = strconv.AppendUint(b, uint64(w.pid), 10)
		b = append(b, `,"line":`...)
		b = appendBytes(b, w.lines[pl.start:pl.end])
		if w.pty {
			b = append(b, `,"pty":true`...)
		}
		if pl.truncated {
			b = append(b, `,"truncated":true`...)
		}
		b = append(b, "}\n"...)
		l.scratch = b
		if l.outUsed+int64(len(b)) > l.outLimit {
			l.output.Store(false)
			l.addLocked(l.noticeLocked(slog.LevelWarn, fmt.Sprintf("process output logging stopped: the output limit of %d bytes is reached", l.outLimit)))
			break
		}
		l.outUsed += int64(len(b))
		l.addLocked(b)
	}
	l.flushLocked()
}

// Lines splits one output stream of one process into lines and logs them.
// Its methods are not safe for concurrent use; a nil *Lines logs nothing.
type Lines struct {
	l      *Log
	source Source
	pid    uint32
	pty    bool
	buf    []byte // the line so far, at most MaxLine bytes
	cut    bool   // the line passed MaxLine and was logged: drop until '\n'

	lines   []byte        // the text of the lines of one Write
	pending []pendingLine // and where each is in lines
}

type pendingLine struct {
	start, end int
	truncated  bool
}

// Lines returns the line splitter of one output stream of process pid, or nil
// when output lines are not logged. A PTY's output is logged as stdout with
// "pty":true.
func (l *Log) Lines(source Source, pid uint32, pty bool) *Lines {
	if l == nil || !l.OutputEnabled() {
		return nil
	}
	return &Lines{l: l, source: source, pid: pid, pty: pty}
}

// Write logs every line that p completes, all in one write; a partial line
// waits for the next Write or Close.
func (w *Lines) Write(p []byte) {
	if w == nil {
		return
	}
	if !w.l.OutputEnabled() {
		w.buf = nil
		return
	}
	for len(p) > 0 {
		chunk, rest, newline := bytes.Cut(p, []byte{'\n'})
		p = rest
		if !w.cut {
			if room := MaxLine - len(w.buf); len(chunk) > room {
				w.buf = append(w.buf, chunk[:room]...)
				w.emit(true)
				w.cut = true
			} else {
				w.buf = append(w.buf, chunk...)
			}
		}
		if newline {
			if !w.cut {
				w.emit(false)
			}
			w.cut = false
			w.buf = w.buf[:0]
		}
	}
	w.flush()
}

// Close logs the last line when it did not end with a newline.
func (w *Lines) Close() {
	if w == nil || w.cut || len(w.buf) == 0 || !w.l.OutputEnabled() {
		return
	}
	w.emit(false)
	w.buf = w.buf[:0]
	w.flush()
}

func (w *Lines) emit(truncated bool) {
	line := w.buf
	if truncated {
		line = cutRune(line)
	}
	line = bytes.TrimSuffix(line, []byte{'\r'})
	start := len(w.lines)
	w.lines = append(w.lines, line...)
	w.pending = append(w.pending, pendingLine{start: start, end: len(w.lines), truncated: truncated})
}

func (w *Lines) flush() {
	if len(w.pending) > 0 {
		w.l.writeOutput(w)
	}
	w.lines, w.pending = w.lines[:0], w.pending[:0]
	if cap(w.lines) > 1<<20 {
		w.lines = nil
	}
}

// cutRune drops a UTF-8 sequence that a cut left incomplete at the end of b.
func cutRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			return b
		}
	}
	return b
}

// Truncate cuts s to at most n bytes (on a rune boundary), for attributes
// that come from requests.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return string(cutRune([]byte(s[:n]))) + "…"
}
