// Package envdlog reads a sandbox's log as envd writes it: JSON lines
// {"time","source","line"}, with envd's own plain output between them. It
// reads from the end of the file, as far back as the lines asked for.
package envdlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// maxLine bounds one line; the rest of a longer one is dropped.
const maxLine = sandboxdapi.MaxLogLineBytes

// logLine is one line of a sandbox's log as envd writes it.
type logLine struct {
	Time   time.Time `json:"time"`
	Source string    `json:"source"`
	Line   *string   `json:"line"`
	Level  string    `json:"level"`
}

// Query says which lines of a log Read returns.
type Query struct {
	// Start and End bound the lines' times, both included; zero is open.
	Start, End time.Time
	// Limit is the most lines returned; at least 1.
	Limit int
	// Forward returns the window's oldest lines, else its newest.
	Forward bool
	// MinLevel keeps lines of this level or above (Levels; a line without
	// one is info's); empty keeps every line.
	MinLevel string
	// Search keeps lines whose text has it (case-sensitive).
	Search string
	// MaxBytes bounds the returned lines' text together, but for the first
	// line, which is returned whatever its size; 0 is no bound.
	MaxBytes int
	// Skip leaves out the window's first Skip lines (that pass the
	// filters), with Forward: a caller paging by time has had them (lines
	// that share the time of its last one).
	Skip int
}

// Levels are the levels of envd's lines, least severe first, as Read
// reports them.
var Levels = []string{"debug", "info", "warn", "error"}

// levelRank is level's place in Levels; info's for none or another.
func levelRank(level string) int {
	if i := slices.Index(Levels, level); i >= 0 {
		return i
	}
	return 1
}

// within says whether t is in q's window.
func (q *Query) within(t time.Time) bool {
	return (q.Start.IsZero() || !t.Before(q.Start)) && (q.End.IsZero() || !t.After(q.End))
}

// keeps says whether e passes q's filters of level and text.
func (q *Query) keeps(e *pb.LogEntry) bool {
	return (q.MinLevel == "" || levelRank(e.GetLevel()) >= levelRank(q.MinLevel)) && strings.Contains(e.GetLine(), q.Search)
}

// page counts the lines a Read returns against its limits.
type page struct {
	q            *Query
	lines, bytes int
}

// fits says whether n more lines of size bytes together fit, beside the
// lines counted.
func (p *page) fits(n, size int) bool {
	total := p.lines + n
	return total <= p.q.Limit && (total == 1 || p.q.MaxBytes <= 0 || p.bytes+size <= p.q.MaxBytes)
}

func (p *page) add(e *pb.LogEntry) {
	p.lines++
	p.bytes += len(e.GetLine())
}

// Read parses the log at path: JSON lines {"time","source","line","level"}
// from envd. Any other line (envd's own output before it logs JSON, a
// panic) is source "envd" with the time of the line before it, or, for the
// first lines, since (or the first JSON line's time, if that is earlier):
// the file cannot say when they were written, only that it was not
// earlier. A last line without its line's end is being written, and is
// left for the next call. A missing file is an empty log. The answer is
// oldest first either way.
//
// It reads only as much of the file as the lines asked for need: a log
// holds up to envd's 64 MiB, and parsing all of it for every call (as an
// SDK's polling makes them) cost a core. Lines are in time order, so the
// window's edges are found by bisection, and the newest lines are read
// from the window's end backwards, the oldest from its start on. With a
// filter, as far as it takes to find the lines (the whole window when few
// pass), until ctx ends.
func Read(ctx context.Context, path string, q Query, since time.Time) ([]*pb.LogEntry, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return []*pb.LogEntry{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open sandbox log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open sandbox log: %w", err)
	}
	lf := &logFile{ctx: ctx, f: f}
	if lf.size, err = wholeLines(f, st.Size()); err != nil {
		return nil, fmt.Errorf("read sandbox log: %w", err)
	}
	q.Limit = max(q.Limit, 1)
	var out []*pb.LogEntry
	if q.Forward {
		out, err = lf.readForward(&q, since)
	} else {
		out, err = lf.readBackward(&q, since)
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox log: %w", err)
	}
	return out, nil
}

// logFile is a log as one Read sees it.
type logFile struct {
	ctx  context.Context
	f    *os.File
	size int64 // up to the end of its last whole line
	// first is where its first JSON line starts (size when none), at
	// firstTime; found once asked for (firstJSON).
	first     int64
	firstTime time.Time
	hasJSON   bool
	found     bool
}

// firstJSON finds the log's first JSON line (lf.first, lf.firstTime,
// lf.hasJSON), once: a log begins with one but for envd's (or runsc's)
// plain words before it.
func (lf *logFile) firstJSON() error {
	if lf.found {
		return nil
	}
	var err error
	lf.first, lf.firstTime, lf.hasJSON, err = lf.nextJSONLine(0, lf.size)
	lf.found = err == nil
	return err
}

// leadingTime is the time of the plain lines before the first JSON line:
// since, or that line's time if it is earlier (a claimed warm sandbox's
// since is after them).
func (lf *logFile) leadingTime(since time.Time) (time.Time, error) {
	if err := lf.firstJSON(); err != nil {
		return time.Time{}, err
	}
	if lf.hasJSON && lf.firstTime.Before(since) {
		return lf.firstTime, nil
	}
	return since, nil
}

// wholeLines is where the last line's end of the first size bytes of f
// is, past it: what follows is a line envd is writing.
func wholeLines(f *os.File, size int64) (int64, error) {
	buf := make([]byte, 64<<10)
	for end := size; end > 0; {
		n := min(int64(len(buf)), end)
		b := buf[:n]
		if _, err := f.ReadAt(b, end-n); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return end - n + int64(i) + 1, nil
		}
		end -= n
	}
	return 0, nil
}

// readBackward is Read of the window's newest lines.
func (lf *logFile) readBackward(q *Query, since time.Time) ([]*pb.LogEntry, error) {
	end := lf.size
	if !q.End.IsZero() {
		var err error
		if end, err = lf.firstAtOrAfter(q.End.Add(time.Nanosecond)); err != nil {
			return nil, err
		}
	}
	// out is newest first; pending are plain lines newer than the next
	// JSON line up, whose time that line gives them.
	// pendingFull: one of them did not fit, so once they are known to be
	// in the window the page is full.
	var out, pending []*pb.LogEntry
	pendingBytes, pendingFull := 0, false
	pg := page{q: q}
	done := false
	err := lf.linesBackward(end, func(raw []byte) bool {
		if len(raw) == 0 {
			return true
		}
		e, t, ok := parseJSONLine(raw)
		if !ok {
			e = &pb.LogEntry{Line: string(raw), Source: "envd"}
			if !pendingFull && q.keeps(e) {
				if pg.fits(len(pending)+1, pendingBytes+len(e.GetLine())) {
					pending = append(pending, e)
					pendingBytes += len(e.GetLine())
				} else {
					pendingFull = true
				}
			}
			return true
		}
		if !q.Start.IsZero() && t.Before(q.Start) {
			done = true // this line, the pending ones and all before it are older
			return false
		}
		if !q.End.IsZero() && t.After(q.End) {
			// Out of order: it, and the plain lines after it, are past the
			// window.
			pending, pendingBytes, pendingFull = pending[:0], 0, false
			return true
		}
		for _, p := range pending {
			p.Timestamp = e.GetTimestamp()
			pg.add(p)
		}
		out = append(out, pending...)
		pending, pendingBytes = pending[:0], 0
		if pendingFull {
			done = true
			return false
		}
		if q.keeps(e) {
			if !pg.fits(1, len(e.GetLine())) {
				done = true
				return false
			}
			pg.add(e)
			out = append(out, e)
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if !done && len(pending) > 0 {
		// The first lines, before any JSON line.
		if since, err = lf.leadingTime(since); err != nil {
			return nil, err
		}
		if q.within(since) {
			for _, p := range pending {
				p.Timestamp = timestamppb.New(since)
			}
			out = append(out, pending...)
		}
	}
	slices.Reverse(out)
	return out, nil
}

// readForward is Read of the window's oldest lines.
func (lf *logFile) readForward(q *Query, since time.Time) ([]*pb.LogEntry, error) {
	var start int64
	if !q.Start.IsZero() {
		var err error
		if start, err = lf.firstAtOrAfter(q.Start); err != nil {
			return nil, err
		}
		// The plain lines before the first JSON line have since's time,
		// not an older one: the window checks them.
		if err := lf.firstJSON(); err != nil {
			return nil, err
		}
		if start == lf.first {
			start = 0
		}
	}
	br := bufio.NewReaderSize(io.NewSectionReader(lf.f, start, lf.size-start), 64<<10)
	line := make([]byte, 0, maxLine)
	out := []*pb.LogEntry{}
	pg := page{q: q}
	skipped := 0
	var last time.Time // the time of the JSON line before
	sawJSON := false
	for n := 0; ; n++ {
		if n%1024 == 0 {
			if err := lf.ctx.Err(); err != nil {
				return nil, err
			}
		}
		raw, _, err := readLine(br, line)
		if len(raw) > 0 {
			e, t, ok := parseJSONLine(raw)
			switch {
			case ok:
				if !q.End.IsZero() && t.After(q.End) {
					return out, nil
				}
				last, sawJSON = t, true
			case !sawJSON && last.IsZero():
				// The first lines, before any JSON line (start is 0).
				var err error
				if last, err = lf.leadingTime(since); err != nil {
					return nil, err
				}
				fallthrough
			default:
				e, t = &pb.LogEntry{Timestamp: timestamppb.New(last), Line: string(raw), Source: "envd"}, last
			}
			if q.within(t) && q.keeps(e) {
				if skipped < q.Skip {
					skipped++
					continue
				}
				if !pg.fits(1, len(e.GetLine())) {
					return out, nil
				}
				pg.add(e)
				out = append(out, e)
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// readLine reads one line into buf (reused) without its line ending,
// keeping at most maxLine bytes of it; n is every byte it took, the line's
// end and what was dropped included. At the file's end err is io.EOF,
// with the last line if it has no line's end.
func readLine(br *bufio.Reader, buf []byte) (line []byte, n int64, err error) {
	line = buf[:0]
	for {
		chunk, err := br.ReadSlice('\n')
		n += int64(len(chunk))
		if room := maxLine - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), n, err
	}
}

// firstAtOrAfter is the offset of the log's first JSON line whose time is
// t or later (its size when there is none), found by bisection: lines are
// in time order, and a plain line has the time of the JSON line before it.
// Each probe looks only below hi, where the answer is known: with no JSON
// line between the two, the answer at mid is hi's. So long runs of plain
// lines cost a read, not one for each probe.
func (lf *logFile) firstAtOrAfter(t time.Time) (int64, error) {
	lo, hi := int64(0), lf.size
	for lo < hi {
		mid := lo + (hi-lo)/2
		_, lt, ok, err := lf.nextJSONLine(mid, hi)
		if err != nil {
			return 0, err
		}
		if ok && lt.Before(t) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	at, _, _, err := lf.nextJSONLine(lo, lf.size)
	return at, err
}

// nextJSONLine finds the first JSON line of the log that starts at off or
// after, and before limit: where it starts, and its time; ok is false,
// and at the log's size, when there is none.
func (lf *logFile) nextJSONLine(off, limit int64) (at int64, t time.Time, ok bool, err error) {
	if err := lf.ctx.Err(); err != nil {
		return 0, time.Time{}, false, err
	}
	at = off
	if off > 0 {
		at = off - 1 // a line starts at off if a line ends just before it
	}
	br := bufio.NewReaderSize(io.NewSectionReader(lf.f, at, lf.size-at), 4<<10)
	var line []byte
	if off > 0 {
		_, n, err := readLine(br, line)
		if err != nil {
			return lf.size, time.Time{}, false, ignoreEOF(err)
		}
		at += n
	}
	for at < limit {
		raw, n, err := readLine(br, line)
		line = raw
		if len(raw) > 0 {
			if _, t, ok := parseJSONLine(raw); ok {
				return at, t, true, nil
			}
		}
		if err != nil {
			return lf.size, time.Time{}, false, ignoreEOF(err)
		}
		at += n
	}
	return lf.size, time.Time{}, false, nil
}

func ignoreEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// linesBackward calls fn with each line of the first size bytes of the
// log, newest first, without its line ending and cut to maxLine bytes,
// until fn returns false or ctx ends. The slice is fn's only during the
// call.
func (lf *logFile) linesBackward(size int64, fn func([]byte) bool) error {
	f := lf.f
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	line := make([]byte, maxLine)
	end := size // the end of the newest line not yet given
	emit := func(from int64, b []byte, pos int64) (bool, error) {
		n := min(end-from, maxLine)
		var raw []byte
		if off := from - pos; off >= 0 && off+n <= int64(len(b)) {
			raw = b[off : off+n]
		} else {
			if _, err := f.ReadAt(line[:n], from); err != nil {
				return false, err
			}
			raw = line[:n]
		}
		return fn(bytes.TrimRight(raw, "\r\n")), nil
	}
	for pos := size; pos > 0; {
		if err := lf.ctx.Err(); err != nil {
			return err
		}
		n := min(chunk, pos)
		pos -= n
		b := buf[:n]
		if _, err := f.ReadAt(b, pos); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != '\n' {
				continue
			}
			if more, err := emit(pos+int64(i)+1, b, pos); err != nil || !more {
				return err
			}
			end = pos + int64(i)
		}
		if pos == 0 {
			_, err := emit(0, b, 0)
			return err
		}
	}
	return nil
}

// parseJSONLine reads a line envd wrote as JSON; ok is false for any other
// line.
func parseJSONLine(raw []byte) (e *pb.LogEntry, t time.Time, ok bool) {
	var l logLine
	if raw[0] != '{' || json.Unmarshal(raw, &l) != nil || l.Line == nil || l.Time.IsZero() {
		return nil, time.Time{}, false
	}
	src := l.Source
	if src != "stdout" && src != "stderr" {
		src = "envd"
	}
	level := strings.ToLower(l.Level)
	if !slices.Contains(Levels, level) {
		level = ""
	}
	return &pb.LogEntry{Timestamp: timestamppb.New(l.Time), Line: *l.Line, Source: src, Level: level}, l.Time, true
}

// trimSuffix, and a random end, name the copy Trim writes beside a log.
const trimSuffix = ".trim-"

// Trim cuts the log at path, when it holds more than most bytes, to its
// newest lines of at most keep bytes, before a sandbox boots again on it.
// Each boot's envd keeps to a budget of its own (--log-limit, 64 MiB), so
// without a cut a sandbox that pauses to its files and resumes again and
// again would grow its log on the host without bound. Nothing may write
// the log meanwhile. A log that does not exist is left so, and so is one
// that is not a file of its own (a native sandbox with a disk links its
// log to a file on that disk, which the disk's size bounds).
func Trim(path string, most, keep int64) error {
	// What a Trim that sandboxd died in left.
	if stale, err := filepath.Glob(path + trimSuffix + "*"); err == nil {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() <= most {
		return nil
	}
	var r io.Reader = io.NewSectionReader(f, st.Size()-keep, keep)
	// From the first whole line in what is kept: the line the cut falls in
	// goes. A window with no line's end in it (not envd's lines, which
	// are shorter) is kept as it is.
	br := bufio.NewReader(r)
	if _, err := br.ReadBytes('\n'); err == nil {
		r = br
	} else {
		r = io.NewSectionReader(f, st.Size()-keep, keep)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+trimSuffix+"*")
	if err != nil {
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	err = tmp.Chmod(st.Mode().Perm())
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && err == nil {
		err = tmp.Chown(int(sys.Uid), int(sys.Gid))
	}
	if err != nil {
		tmp.Close()
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("trim sandbox log: %w", err)
	}
	return nil
}
