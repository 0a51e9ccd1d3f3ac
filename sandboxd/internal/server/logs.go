package server

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
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
	// maxLogLine bounds one line; the rest of a longer one is dropped.
	maxLogLine = 64 << 10
)

// Logs returns the lines of the sandbox's log, oldest first: the newest
// limit lines at or after start.
func (s *Server) Logs(_ context.Context, req *connect.Request[pb.LogsRequest]) (*connect.Response[pb.LogsResponse], error) {
	m := req.Msg
	var f fieldErrors
	checkID(&f, m.GetSandboxId())
	limit := int(m.GetLimit())
	switch {
	case limit < 0:
		f.add("limit", "must not be negative, got %d", limit)
	case limit == 0:
		limit = defaultLogLimit
	}
	limit = min(limit, maxLogLimit)
	var start time.Time
	if m.GetStart() != nil {
		if err := m.GetStart().CheckValid(); err != nil {
			f.add("start", "%v", err)
		}
		start = m.GetStart().AsTime()
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	rec, err := s.reg.Get(m.GetSandboxId())
	if err != nil {
		return nil, toConnect(err)
	}
	entries, err := readLog(s.logPath(rec.ID), start, limit, rec.StartedAt)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.LogsResponse{Logs: entries}), nil
}

// logLine is one line of a sandbox's log as envd writes it.
type logLine struct {
	Time   time.Time `json:"time"`
	Source string    `json:"source"`
	Line   *string   `json:"line"`
}

// readLog parses the log at path: JSON lines {"time","source","line"} from
// envd. Any other line (envd's own output before it logs JSON, a panic) is
// source "envd" with the time of the line before it, or, for the first
// lines, since: the file cannot say when they were written, only that it
// was not earlier. A missing file is an empty log.
func readLog(path string, start time.Time, limit int, since time.Time) ([]*pb.LogEntry, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return []*pb.LogEntry{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open sandbox log: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	last := since
	kept := make([]*pb.LogEntry, 0, min(limit, 256))
	next := 0 // once kept is full, the index of its oldest entry
	for {
		raw, err := readLine(br)
		if len(raw) > 0 {
			e, t := parseLogLine(raw, last)
			last = t
			if start.IsZero() || !t.Before(start) {
				if len(kept) < limit {
					kept = append(kept, e)
				} else {
					kept[next] = e
					next = (next + 1) % limit
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read sandbox log: %w", err)
		}
	}
	return slices.Concat(kept[next:], kept[:next]), nil
}

// parseLogLine reads one line, and returns it with its time.
func parseLogLine(raw []byte, last time.Time) (*pb.LogEntry, time.Time) {
	var l logLine
	if raw[0] == '{' && json.Unmarshal(raw, &l) == nil && l.Line != nil && !l.Time.IsZero() {
		src := l.Source
		if src != "stdout" && src != "stderr" {
			src = "envd"
		}
		return &pb.LogEntry{Timestamp: timestamppb.New(l.Time), Line: *l.Line, Source: src}, l.Time
	}
	return &pb.LogEntry{Timestamp: timestamppb.New(last), Line: string(raw), Source: "envd"}, last
}

// readLine reads one line without its line ending, keeping at most
// maxLogLine bytes of it.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if room := maxLogLine - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}
