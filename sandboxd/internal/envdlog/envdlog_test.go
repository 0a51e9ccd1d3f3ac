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
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// logsLimit is the Logs RPC's default limit.
const logsLimit = 1000

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestReadLog(t *testing.T) {
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return since.Add(time.Duration(s) * time.Second) }
	log := strings.Join([]string{
		"envd starting", // plain, before any JSON: the file's start time
		`{"time":"2026-01-01T00:00:01Z","source":"envd","line":"listening","level":"info"}`,
		`{"time":"2026-01-01T00:00:02Z","source":"stdout","line":"hello"}`,
		"panic: oops", // plain: the time of the line before
		`{"time":"2026-01-01T00:00:03Z","source":"stderr","line":""}`,
		`{"time":"2026-01-01T00:00:04Z","source":"weird","line":"x"}`,
		`{"time":"2026-01-01T00:00:05Z","msg":"no line field"}`,
		"",
		`{"time":"2026-01-01T00:00:06Z","source":"stdout","line":"last"}` + "\r",
	}, "\n")
	path := filepath.Join(t.TempDir(), "x.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	type line struct {
		t      time.Time
		source string
		text   string
	}
	all := []line{
		{since, "envd", "envd starting"},
		{at(1), "envd", "listening"},
		{at(2), "stdout", "hello"},
		{at(2), "envd", "panic: oops"},
		{at(3), "stderr", ""},
		{at(4), "envd", "x"},
		{at(4), "envd", `{"time":"2026-01-01T00:00:05Z","msg":"no line field"}`},
		{at(6), "stdout", "last"},
	}
	for _, tc := range []struct {
		name  string
		start time.Time
		limit int
		want  []line
	}{
		{"all", time.Time{}, 100, all},
		{"newest two", time.Time{}, 2, all[6:]},
		{"since 2s", at(2), 100, all[2:]},
		{"since 2s, newest three", at(2), 3, all[5:]},
		{"after everything", at(7), 100, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Read(path, tc.start, tc.limit, since)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d lines, want %d: %v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				g := got[i]
				if !g.GetTimestamp().AsTime().Equal(w.t) || g.GetSource() != w.source || g.GetLine() != w.text {
					t.Fatalf("line %d = %v, want %+v", i, g, w)
				}
			}
		})
	}
	got, err := Read(filepath.Join(t.TempDir(), "missing.log"), time.Time{}, 10, since)
	if err != nil || len(got) != 0 {
		t.Fatalf("missing log = %v, %v", got, err)
	}
}

func TestReadLogLongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	long := strings.Repeat("a", 3*maxLine)
	if err := os.WriteFile(path, []byte(long+"\nafter\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path, time.Time{}, 10, time.Time{})
	if err != nil || len(got) != 2 || len(got[0].GetLine()) != maxLine || got[1].GetLine() != "after" {
		t.Fatalf("got %d lines (%v)", len(got), err)
	}
}

func FuzzReadLog(f *testing.F) {
	f.Add([]byte(`{"time":"2026-01-01T00:00:01Z","source":"stdout","line":"hi"}` + "\nplain\n"))
	f.Add([]byte("{\n{}\n{\"line\":null}\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "x.log")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, limit := range []int{1, 3, 1000} {
			got, err := Read(path, time.Time{}, limit, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			for _, start := range []time.Time{{}, epoch, time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC)} {
				since := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
				back, err := Read(path, start, limit, since)
				if err != nil {
					t.Fatal(err)
				}
				fwd, err := readLogForward(path, start, limit, since)
				if err != nil {
					t.Fatal(err)
				}
				if len(back) != len(fwd) {
					t.Fatalf("start %v limit %d: %d lines from the end, %d from the start", start, limit, len(back), len(fwd))
				}
				for i := range back {
					if !proto.Equal(back[i], fwd[i]) {
						t.Fatalf("start %v limit %d: line %d = %v from the end, %v from the start", start, limit, i, back[i], fwd[i])
					}
				}
			}
			if len(got) > limit {
				t.Fatalf("%d lines over limit %d", len(got), limit)
			}
			for _, e := range got {
				if e.GetTimestamp() == nil || (e.GetSource() != "envd" && e.GetSource() != "stdout" && e.GetSource() != "stderr") {
					t.Fatalf("entry %v", e)
				}
			}
		}
	})
}

// readLogForward is Read as it was, reading the whole file from its
// start: the reference that FuzzReadLog holds Read to.
func readLogForward(path string, start time.Time, limit int, since time.Time) ([]*pb.LogEntry, error) {
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
// maxLine bytes of it.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if room := maxLine - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

// BenchmarkReadLog is one Logs call's read of a full log (64 MiB, envd's
// budget), its newest 1000 lines: from the end as Read reads, and from
// the start as it did.
func BenchmarkReadLog(b *testing.B) {
	path := filepath.Join(b.TempDir(), "x.log")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := 0; ; i++ {
		fmt.Fprintf(w, `{"time":"2026-01-01T00:00:%02dZ","source":"stdout","pid":42,"line":"line %d of a process's output, long enough to look like one"}`+"\n", i%60, i)
		if st, _ := f.Stat(); i%4096 == 0 && st.Size() >= 64<<20 {
			break
		}
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		read func(string, time.Time, int, time.Time) ([]*pb.LogEntry, error)
	}{{"from-the-end", Read}, {"whole-file", readLogForward}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if got, err := c.read(path, time.Time{}, logsLimit, time.Time{}); err != nil || len(got) != logsLimit {
					b.Fatalf("%d lines, %v", len(got), err)
				}
			}
		})
	}
}

// A log past the bound is cut to its newest whole lines within what is
// kept, with its mode; one within it, or none, is left as it is.
func TestTrim(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sb.log")
	var b strings.Builder
	for i := 0; b.Len() < 3000; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	full := b.String()
	if err := os.WriteFile(path, []byte(full), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := Trim(path, int64(len(full)), 100); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != full {
		t.Fatalf("a log within the bound changed: %d bytes, was %d", len(got), len(full))
	}
	if err := Trim(path, 1000, 100); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > 100 || len(got) == 0 || !strings.HasSuffix(full, string(got)) || !strings.HasPrefix(string(got), "line ") ||
		full[len(full)-len(got)-1] != '\n' {
		t.Fatalf("trimmed log %q: want the newest whole lines of the log, at most 100 bytes", got)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("trimmed log's mode: %v, %v; want 640", st.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("%d files left in the log's folder, want the log alone", len(entries))
	}
	if err := Trim(filepath.Join(dir, "none.log"), 1, 1); err != nil {
		t.Fatalf("trim of no log: %v", err)
	}
	// A window with no line's end in it is kept as it is, and what a
	// Trim that died left beside the log goes.
	oneLine := filepath.Join(dir, "one.log")
	if err := os.WriteFile(oneLine, []byte(strings.Repeat("x", 3000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(oneLine+".trim-left", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Trim(oneLine, 1000, 100); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(oneLine); string(got) != strings.Repeat("x", 100) {
		t.Fatalf("a log of one long line, trimmed: %d bytes, want its last 100", len(got))
	}
	if _, err := os.Stat(oneLine + ".trim-left"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("what a Trim that died left: %v, want it gone", err)
	}
	_ = os.Remove(oneLine)
	// A log linked to a file elsewhere (a native sandbox's disk) is left
	// as it is, link and file.
	disk := filepath.Join(t.TempDir(), "envd.log")
	if err := os.WriteFile(disk, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "linked.log")
	if err := os.Symlink(disk, link); err != nil {
		t.Fatal(err)
	}
	if err := Trim(link, 1000, 100); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(link); err != nil || target != disk {
		t.Fatalf("the linked log is %q (%v), want the link to %s", target, err, disk)
	}
	if got, _ := os.ReadFile(disk); string(got) != full {
		t.Fatalf("the file the log links to changed: %d bytes, was %d", len(got), len(full))
	}
}
