// Package envdlog reads a sandbox's log as envd writes it: JSON lines
// {"time","source","line"}, with envd's own plain output between them. It
// reads from the end of the file, as far back as the lines asked for.
package envdlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// maxLine bounds one line; the rest of a longer one is dropped.
const maxLine = 64 << 10

// logLine is one line of a sandbox's log as envd writes it.
type logLine struct {
	Time   time.Time `json:"time"`
	Source string    `json:"source"`
	Line   *string   `json:"line"`
}

// Read parses the log at path: JSON lines {"time","source","line"} from
// envd. Any other line (envd's own output before it logs JSON, a panic) is
// source "envd" with the time of the line before it, or, for the first
// lines, since: the file cannot say when they were written, only that it
// was not earlier. A missing file is an empty log.
//
// It reads the file from its end, only as far back as the newest limit
// lines at or after start need: a log holds up to envd's 64 MiB, and
// parsing all of it for every call (as an SDK's polling makes them) cost a
// core. Lines are in time order, so the first one older than start ends the
// search.
func Read(path string, start time.Time, limit int, since time.Time) ([]*pb.LogEntry, error) {
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
	// out is newest first; pending are plain lines newer than the next
	// JSON line up, whose time that line gives them.
	var out, pending []*pb.LogEntry
	done := false
	err = linesBackward(f, st.Size(), func(raw []byte) bool {
		if len(raw) == 0 {
			return true
		}
		e, t, ok := parseJSONLine(raw)
		if !ok {
			if len(out)+len(pending) < limit {
				pending = append(pending, &pb.LogEntry{Line: string(raw), Source: "envd"})
			}
			return true
		}
		if !start.IsZero() && t.Before(start) {
			done = true // this line, the pending ones and all before it are older
			return false
		}
		for _, p := range pending {
			p.Timestamp = e.GetTimestamp()
		}
		out = append(append(out, pending...), e)
		pending = pending[:0]
		if len(out) >= limit {
			done = true
			return false
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("read sandbox log: %w", err)
	}
	if !done && (start.IsZero() || !since.Before(start)) {
		for _, p := range pending {
			p.Timestamp = timestamppb.New(since)
		}
		out = append(out, pending...)
	}
	out = out[:min(len(out), limit)]
	slices.Reverse(out)
	return out, nil
}

// linesBackward calls fn with each line of the first size bytes of f,
// newest first, without its line ending and cut to maxLine bytes, until
// fn returns false. The slice is fn's only during the call.
func linesBackward(f *os.File, size int64, fn func([]byte) bool) error {
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
	return &pb.LogEntry{Timestamp: timestamppb.New(l.Time), Line: *l.Line, Source: src}, l.Time, true
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
