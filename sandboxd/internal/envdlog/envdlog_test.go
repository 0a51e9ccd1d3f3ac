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
	"math/rand/v2"
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
		`{"time":"2026-01-01T00:00:07Z","source":"std`,
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
		// The line after "last" has no end yet: left out.
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
			got, err := Read(t.Context(), path, Query{Start: tc.start, Limit: tc.limit}, since)
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
	got, err := Read(t.Context(), filepath.Join(t.TempDir(), "missing.log"), Query{Limit: 10}, since)
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
	got, err := Read(t.Context(), path, Query{Limit: 10}, time.Time{})
	if err != nil || len(got) != 2 || len(got[0].GetLine()) != maxLine || got[1].GetLine() != "after" {
		t.Fatalf("got %d lines (%v)", len(got), err)
	}
}

func FuzzReadLog(f *testing.F) {
	f.Add([]byte(`{"time":"2026-01-01T00:00:01Z","source":"stdout","line":"hi"}` + "\nplain\n"))
	f.Add([]byte("{\n{}\n{\"line\":null}\n\r\n"))
	f.Add([]byte(`{"time":"2026-01-01T00:00:01Z","source":"envd","line":"a","level":"WARN"}` + "\nplain\n" +
		`{"time":"2026-01-01T00:00:02Z","source":"stdout","line":"bb"}` + "\n" + `{"time":"2026-01-01T00:00:02Z","line":"ccc","level":"ERROR"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "x.log")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		sorted := timesSorted(data)
		for _, limit := range []int{1, 3, 1000} {
			for i, start := range []time.Time{{}, epoch, time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC)} {
				// since before the lines, and after some.
				since := []time.Time{time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC)}[(i+limit)%2]
				for _, q := range []Query{
					{Start: start, Limit: limit},
					{Start: start, Limit: limit, Forward: true},
					{End: start, Limit: limit, MaxBytes: 2},
					{Start: start, Limit: limit, Forward: true, MinLevel: "warn", Search: "b"},
					{Start: start, Limit: limit, Forward: true, Skip: 1},
				} {
					got, err := Read(t.Context(), path, q, since)
					if err != nil {
						t.Fatal(err)
					}
					if len(got) > limit {
						t.Fatalf("%d lines over limit %d", len(got), limit)
					}
					for _, e := range got {
						if e.GetTimestamp() == nil || (e.GetSource() != "envd" && e.GetSource() != "stdout" && e.GetSource() != "stderr") {
							t.Fatalf("entry %v", e)
						}
					}
					if !sorted {
						continue // Read's bisection assumes envd's order
					}
					want, err := readReference(path, q, since)
					if err != nil {
						t.Fatal(err)
					}
					sameEntries(t, fmt.Sprintf("%+v", q), got, want)
				}
			}
		}
	})
}

// timesSorted says whether the JSON lines of a log are in time order, as
// envd writes them.
func timesSorted(data []byte) bool {
	var last time.Time
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		line = bytes.TrimRight(line, "\r\n")
		if len(line) > maxLine {
			line = line[:maxLine]
		}
		if len(line) == 0 {
			continue
		}
		if _, t, ok := parseJSONLine(line); ok {
			if t.Before(last) {
				return false
			}
			last = t
		}
	}
	return true
}

func sameEntries(t *testing.T, what string, got, want []*pb.LogEntry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d lines, want %d:\n%v\nwant\n%v", what, len(got), len(want), got, want)
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: line %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// readReference is Read by its definition, the reference FuzzReadLog and
// TestReadQueries hold it to: every whole line of the file parsed from its
// start, the window and filters applied, then the page taken from the
// window's start (past Skip) or its end.
func readReference(path string, q Query, since time.Time) ([]*pb.LogEntry, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return []*pb.LogEntry{}, nil
	}
	if err != nil {
		return nil, err
	}
	// A last line without its end is still being written.
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	type line struct {
		e     *pb.LogEntry
		t     time.Time
		plain bool
	}
	var lines []line
	var firstTime time.Time
	br := bufio.NewReader(bytes.NewReader(data))
	buf := make([]byte, 0, maxLine)
	for {
		raw, _, err := readLine(br, buf)
		if len(raw) > 0 {
			e, t, ok := parseJSONLine(raw)
			if ok && firstTime.IsZero() {
				firstTime = t
			}
			if !ok {
				e = &pb.LogEntry{Line: string(raw), Source: "envd"}
			}
			lines = append(lines, line{e, t, !ok})
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	// The first plain lines: since, or the first JSON line's time if that
	// is earlier; the others the time of the JSON line before them.
	last := since
	if !firstTime.IsZero() && firstTime.Before(since) {
		last = firstTime
	}
	var window []*pb.LogEntry
	for _, l := range lines {
		if l.plain {
			l.e.Timestamp, l.t = timestamppb.New(last), last
		} else {
			last = l.t
		}
		if (q.Start.IsZero() || !l.t.Before(q.Start)) && (q.End.IsZero() || !l.t.After(q.End)) && q.keeps(l.e) {
			window = append(window, l.e)
		}
	}
	q.Limit = max(q.Limit, 1)
	pg := page{q: &q}
	out := []*pb.LogEntry{}
	if q.Forward {
		window = window[min(q.Skip, len(window)):]
	} else {
		slices.Reverse(window)
	}
	for _, e := range window {
		if !pg.fits(1, len(e.GetLine())) {
			break
		}
		pg.add(e)
		out = append(out, e)
	}
	if !q.Forward {
		slices.Reverse(out)
	}
	return out, nil
}

// Read answers what its definition (readReference) says, for logs as envd
// writes them (several lines to a time, plain lines between, levels, a
// line past maxLine) and every kind of query: windows open and closed,
// both directions, filters, byte bounds.
func TestReadQueries(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"alpha", "beta", "gamma", "delta", "<&>", "\"q\""}
	levels := []string{"", "DEBUG", "INFO", "WARN", "ERROR"}
	var b strings.Builder
	var times []time.Time
	at := epoch
	for i := range 600 {
		at = at.Add(time.Duration(rng.IntN(3)) * 500 * time.Millisecond)
		text := strings.Repeat(words[rng.IntN(len(words))]+" ", rng.IntN(40))
		switch {
		case i == 300:
			text = strings.Repeat("x", maxLine+100) // cut to maxLine
		case rng.IntN(20) == 0:
			b.WriteString("plain " + text + "\n")
			continue
		}
		line, _ := json.Marshal(text)
		fmt.Fprintf(&b, `{"time":%q,"source":"stdout","line":%s`, at.Format(time.RFC3339Nano), line)
		if l := levels[rng.IntN(len(levels))]; l != "" {
			fmt.Fprintf(&b, `,"level":%q`, l)
		}
		b.WriteString("}\n")
		times = append(times, at)
	}
	path := filepath.Join(t.TempDir(), "x.log")
	// runsc's and envd's first plain words, and a last line being written.
	if err := os.WriteFile(path, []byte("envd's first words\nand more\n"+b.String()+`{"time":"`), 0o600); err != nil {
		t.Fatal(err)
	}
	someTime := func() time.Time {
		switch rng.IntN(5) {
		case 0:
			return time.Time{}
		case 1:
			return epoch.Add(-time.Hour)
		case 2:
			return at.Add(time.Hour)
		}
		return times[rng.IntN(len(times))].Add(time.Duration(rng.IntN(3)-1) * time.Millisecond)
	}
	for i := range 800 {
		q := Query{
			Start: someTime(), End: someTime(),
			Limit:    []int{1, 2, 7, 50, 1000}[rng.IntN(5)],
			Forward:  rng.IntN(2) == 0,
			MinLevel: []string{"", "", "debug", "info", "warn", "error"}[rng.IntN(6)],
			MaxBytes: []int{0, 0, 1, 300, 5000, 100 << 10}[rng.IntN(6)],
		}
		if rng.IntN(3) == 0 {
			q.Search = words[rng.IntN(len(words))]
		}
		if q.Forward {
			q.Skip = []int{0, 0, 1, 3, 40}[rng.IntN(5)]
		}
		// A sandbox's start, or (a claimed warm sandbox's) later than its
		// first lines.
		since := epoch.Add(time.Duration(rng.IntN(3)-1) * time.Second)
		if rng.IntN(4) == 0 {
			since = times[rng.IntN(len(times))]
		}
		got, err := Read(t.Context(), path, q, since)
		if err != nil {
			t.Fatal(err)
		}
		want, err := readReference(path, q, since)
		if err != nil {
			t.Fatal(err)
		}
		sameEntries(t, fmt.Sprintf("query %d %+v since %v", i, q, since), got, want)
	}
}

// BenchmarkReadLog is one Logs call's read of a full log (64 MiB, envd's
// budget), 1000 lines: its newest, as Read reads them (from the end), and
// by reading the whole file (readReference, as Read once did); and the
// 1000 after and before a cursor half way, found by bisection.
func BenchmarkReadLog(b *testing.B) {
	path := filepath.Join(b.TempDir(), "x.log")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	var n int
	for ; ; n++ {
		fmt.Fprintf(w, `{"time":%q,"source":"stdout","pid":42,"line":"line %d of a process's output, long enough to look like one"}`+"\n",
			epoch.Add(time.Duration(n)*time.Millisecond).Format(time.RFC3339Nano), n)
		if st, _ := f.Stat(); n%4096 == 0 && st.Size() >= 64<<20 {
			break
		}
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		b.Fatal(err)
	}
	half := epoch.Add(time.Duration(n/2) * time.Millisecond)
	for _, c := range []struct {
		name string
		read func(context.Context, string, Query, time.Time) ([]*pb.LogEntry, error)
		q    Query
	}{
		{"newest", Read, Query{Limit: logsLimit}},
		{"newest-whole-file", func(_ context.Context, path string, q Query, since time.Time) ([]*pb.LogEntry, error) {
			return readReference(path, q, since)
		}, Query{Limit: logsLimit}},
		{"forward-from-half", Read, Query{Start: half, Limit: logsLimit, Forward: true}},
		{"backward-from-half", Read, Query{End: half, Limit: logsLimit}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if got, err := c.read(b.Context(), path, c.q, time.Time{}); err != nil || len(got) != logsLimit {
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
