package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

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
			got, err := readLog(path, tc.start, tc.limit, since)
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
	got, err := readLog(filepath.Join(t.TempDir(), "missing.log"), time.Time{}, 10, since)
	if err != nil || len(got) != 0 {
		t.Fatalf("missing log = %v, %v", got, err)
	}
}

func TestReadLogLongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	long := strings.Repeat("a", 3*maxLogLine)
	if err := os.WriteFile(path, []byte(long+"\nafter\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readLog(path, time.Time{}, 10, time.Time{})
	if err != nil || len(got) != 2 || len(got[0].GetLine()) != maxLogLine || got[1].GetLine() != "after" {
		t.Fatalf("got %d lines (%v)", len(got), err)
	}
}

func TestLogsRPC(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	id := h.create().GetSandbox().GetId()
	var b strings.Builder
	for i := range 1500 {
		b.WriteString(`{"time":"2026-11-29T12:00:00Z","source":"stdout","line":"` + strings.Repeat("x", i%3) + `"}` + "\n")
	}
	if err := os.WriteFile(filepath.Join(h.dir, "logs", id+".log"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id}))
	if err != nil || len(resp.Msg.GetLogs()) != defaultLogLimit {
		t.Fatalf("Logs = %d lines, %v; want the default %d", len(resp.Msg.GetLogs()), err, defaultLogLimit)
	}
	resp, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id, Limit: 5,
		Start: timestamppb.New(epoch)}))
	if err != nil || len(resp.Msg.GetLogs()) != 5 || resp.Msg.GetLogs()[4].GetLine() != "xx" { // line 1499
		t.Fatalf("Logs limit 5 = %v, %v", resp.Msg.GetLogs(), err)
	}
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id, Limit: -1}))
	wantCode(t, err, connect.CodeInvalidArgument, "limit:")
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: "aaaaaaaaaaaaaaaaaaaa"}))
	wantCode(t, err, connect.CodeNotFound)
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
			got, err := readLog(path, time.Time{}, limit, time.Time{})
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
		}
	})
}
