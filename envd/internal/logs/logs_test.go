package logs

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type line struct {
	Time      string `json:"time"`
	Source    Source `json:"source"`
	Level     string `json:"level"`
	Line      string `json:"line"`
	PID       uint32 `json:"pid"`
	PTY       bool   `json:"pty"`
	Truncated bool   `json:"truncated"`
}

// syncBuffer is a bytes.Buffer safe for the concurrent test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newLog(t *testing.T, c Config) (*Log, *syncBuffer) {
	t.Helper()
	var buf syncBuffer
	l := New(&buf, c)
	l.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 600, time.FixedZone("x", 3600)) }
	return l, &buf
}

func parse(t *testing.T, s string) []line {
	t.Helper()
	var out []line
	for _, raw := range strings.SplitAfter(s, "\n") {
		if raw == "" {
			continue
		}
		if !strings.HasSuffix(raw, "\n") || strings.Count(raw, "\n") != 1 {
			t.Fatalf("%q is not one line", raw)
		}
		var l line
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		out = append(out, l)
	}
	return out
}

func TestEnvdLines(t *testing.T) {
	l, buf := newLog(t, Config{})
	l.Logger().Info("hello", "pid", 7, "cmd", "/bin/x")
	l.Logger().Debug("not at info")
	got := parse(t, buf.String())
	if len(got) != 1 || got[0].Source != Envd || got[0].Line != "hello" || got[0].Level != "INFO" || got[0].PID != 7 {
		t.Fatalf("lines %+v", got)
	}
	if ts, err := time.Parse(time.RFC3339Nano, got[0].Time); err != nil || ts.Location() != time.UTC {
		t.Fatalf("time %q: %v, want RFC 3339 in UTC", got[0].Time, err)
	}
	if !strings.Contains(buf.String(), `"cmd":"/bin/x"`) {
		t.Fatalf("no cmd field: %s", buf.String())
	}
}

func TestLinesSplitting(t *testing.T) {
	l, buf := newLog(t, Config{Output: true})
	w := l.Lines(Stdout, 42, false)
	for _, chunk := range []string{"ab", "c\nde", "\n\n", "crlf\r\n", "ünï", "cödé\n", "tail"} {
		w.Write([]byte(chunk))
	}
	w.Close()
	w.Close() // idempotent
	var lines []string
	for _, g := range parse(t, buf.String()) {
		if g.Source != Stdout || g.PID != 42 || g.Truncated || g.PTY {
			t.Fatalf("line %+v", g)
		}
		lines = append(lines, g.Line)
	}
	want := []string{"abc", "de", "", "crlf", "ünïcödé", "tail"}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Fatalf("lines %q, want %q", lines, want)
	}
	if !strings.Contains(buf.String(), `"time":"2026-01-02T02:04:05.0000006Z"`) {
		t.Fatalf("times are not UTC RFC 3339 with nanoseconds: %s", buf.String())
	}
}

func TestLinesTruncation(t *testing.T) {
	l, buf := newLog(t, Config{Output: true})
	w := l.Lines(Stderr, 1, true)
	exact := strings.Repeat("x", MaxLine)
	w.Write([]byte(exact + "\n"))
	// Longer than MaxLine, in pieces: cut at MaxLine, the rest dropped up
	// to the newline.
	w.Write([]byte(strings.Repeat("y", MaxLine-1)))
	w.Write([]byte("éz")) // é straddles the cut
	w.Write([]byte(strings.Repeat("z", 10000) + "\nnext\n"))
	// A long line that never ends is logged once, at the cut.
	w.Write([]byte(strings.Repeat("w", 3*MaxLine)))
	w.Close()
	got := parse(t, buf.String())
	want := []line{
		{Line: exact},
		{Line: strings.Repeat("y", MaxLine-1), Truncated: true},
		{Line: "next"},
		{Line: strings.Repeat("w", MaxLine), Truncated: true},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Line != want[i].Line || got[i].Truncated != want[i].Truncated || !got[i].PTY || got[i].Source != Stderr {
			t.Errorf("line %d: %d bytes truncated %v pty %v, want %d bytes truncated %v", i, len(got[i].Line), got[i].Truncated, got[i].PTY, len(want[i].Line), want[i].Truncated)
		}
	}
}

func TestOutputLimit(t *testing.T) {
	l, buf := newLog(t, Config{Output: true, OutputLimit: 1000})
	w := l.Lines(Stdout, 9, false)
	for range 100 {
		w.Write([]byte("0123456789\n"))
	}
	if l.OutputEnabled() || l.Lines(Stdout, 10, false) != nil {
		t.Fatal("output still logged past the limit")
	}
	l.Logger().Info("after")
	var out, stops int
	var bytes int
	for _, raw := range strings.SplitAfter(buf.String(), "\n") {
		if strings.Contains(raw, `"source":"stdout"`) {
			bytes += len(raw)
		}
	}
	got := parse(t, buf.String())
	for _, g := range got {
		if g.Source == Stdout {
			out++
		}
		if strings.HasPrefix(g.Line, "process output logging stopped") {
			stops++
		}
	}
	if out == 0 || bytes > 1000 || stops != 1 || got[len(got)-1].Line != "after" {
		t.Fatalf("%d output lines of %d bytes, %d stop lines, last %+v", out, bytes, stops, got[len(got)-1])
	}
}

func TestLimit(t *testing.T) {
	l, buf := newLog(t, Config{Output: true, Limit: 1000})
	w := l.Lines(Stdout, 9, false)
	for i := range 100 {
		l.Logger().Info("envd line", "i", i)
		w.Write([]byte("output\n"))
	}
	got := parse(t, buf.String())
	if last := got[len(got)-1]; !strings.HasPrefix(last.Line, "logging stopped") || last.Level != "WARN" {
		t.Fatalf("last line %+v, want the stop notice", last)
	}
	if n := len(buf.String()); n > 1000+200 {
		t.Fatalf("%d bytes logged, want about 1000", n)
	}
	if l.OutputEnabled() {
		t.Fatal("output logging on after the limit")
	}
}

func TestMaxRecord(t *testing.T) {
	l, buf := newLog(t, Config{})
	l.Logger().Info("big", "x", strings.Repeat("a", MaxRecord))
	got := parse(t, buf.String())
	if len(got) != 1 || !strings.HasPrefix(got[0].Line, "log line of") {
		t.Fatalf("lines %+v, want the dropped notice", got)
	}
}

func TestOutputOff(t *testing.T) {
	l, buf := newLog(t, Config{})
	w := l.Lines(Stdout, 1, false)
	if w != nil {
		t.Fatal("Lines with output off")
	}
	w.Write([]byte("x\n")) // a nil *Lines is a no-op
	w.Close()
	if buf.String() != "" {
		t.Fatalf("logged %q", buf.String())
	}
	var nilLog *Log
	if nilLog.Lines(Stdout, 1, false) != nil {
		t.Fatal("Lines of a nil log")
	}
}

func TestConcurrentLinesStayWhole(t *testing.T) {
	l, buf := newLog(t, Config{Output: true})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			w := l.Lines(Stdout, uint32(i), false)
			for range 200 {
				w.Write([]byte(strings.Repeat("q", 100) + "\n"))
				l.Logger().Info("tick", "i", i)
			}
		})
	}
	wg.Wait()
	if got := parse(t, buf.String()); len(got) != 8*400 {
		t.Fatalf("%d lines, want %d", len(got), 8*400)
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc…"},
		{"aé", 2, "a…"}, // never half a rune
	} {
		if got := Truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// appendJSON writes what encoding/json writes without HTML escaping, for
// any bytes, and it reads back.
func FuzzAppendJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "quote\" back\\slash", "\x00\x01\b\f\n\r\t\x1f\x7f", "ünï€😀", "bad \xff\xfe utf8 \xe2\x82", "\u2028\u2029", "<a&b>"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := appendBytes(nil, b)
		var std bytes.Buffer
		enc := json.NewEncoder(&std)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(string(b)); err != nil {
			t.Fatal(err)
		}
		if want := bytes.TrimSuffix(std.Bytes(), []byte("\n")); !bytes.Equal(got, want) {
			t.Fatalf("%q: %s, encoding/json %s", b, got, want)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != string([]rune(string(b))) {
			t.Fatalf("%q reads back as %q, %v", b, back, err)
		}
	})
}

func TestAppendJSONAllocs(t *testing.T) {
	buf := make([]byte, 0, 1024)
	in := []byte("line with \"quotes\", \t tabs, ünï and \xff")
	if n := testing.AllocsPerRun(100, func() { buf = appendBytes(buf[:0], in) }); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}

// The log is in time order, and no write's lines share a time with
// another's: a record stamped before an output line written since (slog
// takes its time before the log's lock), and writes within one clock tick,
// come just after. sandboxd bisects the log by time, and pages on it.
func TestLinesInTimeOrder(t *testing.T) {
	l, buf := newLog(t, Config{Output: true}) // a clock that stands still
	w := l.Lines(Stdout, 1, false)
	w.Write([]byte("one\ntwo\n"))
	old := slog.NewRecord(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), slog.LevelInfo, "stamped before", 0)
	if err := l.Logger().Handler().Handle(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("three\n"))
	w.Close()
	var times []time.Time
	var lines []string
	for _, g := range parse(t, buf.String()) {
		ts, err := time.Parse(time.RFC3339Nano, g.Time)
		if err != nil {
			t.Fatal(err)
		}
		times, lines = append(times, ts), append(lines, g.Line)
	}
	t0 := l.now().UTC()
	want := []time.Time{t0, t0, t0.Add(time.Nanosecond), t0.Add(2 * time.Nanosecond)}
	if strings.Join(lines, "|") != "one|two|stamped before|three" || len(times) != len(want) {
		t.Fatalf("lines %q at %v", lines, times)
	}
	for i := range want {
		if !times[i].Equal(want[i]) {
			t.Errorf("line %q at %v, want %v", lines[i], times[i], want[i])
		}
	}
}
