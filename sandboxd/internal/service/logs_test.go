package service

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

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
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id, MinLevel: "WARN"}))
	wantCode(t, err, connect.CodeInvalidArgument, "min_level:")
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id, Search: strings.Repeat("s", maxLogSearch+1)}))
	wantCode(t, err, connect.CodeInvalidArgument, "search:")
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id, End: &timestamppb.Timestamp{Nanos: -1}}))
	wantCode(t, err, connect.CodeInvalidArgument, "end:")
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: id, Skip: 1}))
	wantCode(t, err, connect.CodeInvalidArgument, "skip: only with forward")

	// A window, both ways, with filters; lines of a second each, with
	// envd's levels on every third.
	b.Reset()
	for i := range 3000 {
		level := ""
		if i%3 == 0 {
			level = `,"level":"` + []string{"INFO", "WARN", "ERROR"}[i/3%3] + `"`
		}
		b.WriteString(`{"time":"` + epoch.Add(time.Duration(i)*time.Second).Format(time.RFC3339) + `","source":"stdout","line":"line ` + strconv.Itoa(i) + `"` + level + "}\n")
	}
	if err := os.WriteFile(filepath.Join(h.dir, "logs", id+".log"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	lines := func(req *pb.LogsRequest) []string {
		t.Helper()
		req.SandboxId = id
		resp, err := h.client.Logs(t.Context(), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range resp.Msg.GetLogs() {
			out = append(out, e.GetLine()+"/"+e.GetLevel())
		}
		return out
	}
	at := func(s int) *timestamppb.Timestamp { return timestamppb.New(epoch.Add(time.Duration(s) * time.Second)) }
	for _, c := range []struct {
		name string
		req  *pb.LogsRequest
		want []string
	}{
		{"the oldest from a start", &pb.LogsRequest{Start: at(100), Limit: 2, Forward: true}, []string{"line 100/", "line 101/"}},
		{"the newest up to an end", &pb.LogsRequest{End: at(100), Limit: 2}, []string{"line 99/info", "line 100/"}},
		{"the oldest of the log", &pb.LogsRequest{Limit: 2, Forward: true}, []string{"line 0/info", "line 1/"}},
		{"a window", &pb.LogsRequest{Start: at(10), End: at(12), Forward: true}, []string{"line 10/", "line 11/", "line 12/warn"}},
		{"warn and above", &pb.LogsRequest{Start: at(1), Limit: 3, Forward: true, MinLevel: "warn"}, []string{"line 3/warn", "line 6/error", "line 12/warn"}},
		{"error, the newest", &pb.LogsRequest{Limit: 2, MinLevel: "error"}, []string{"line 2985/error", "line 2994/error"}},
		{"a search", &pb.LogsRequest{Limit: 3, Search: "line 99"}, []string{"line 997/", "line 998/", "line 999/info"}},
		{"the oldest from a start, past the first two", &pb.LogsRequest{Start: at(100), Limit: 2, Forward: true, Skip: 2}, []string{"line 102/warn", "line 103/"}},
	} {
		if got := lines(c.req); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}

	// An answer holds at most sandboxdapi.MaxLogsAnswerBytes of text: of 300 lines of
	// 10 KiB (60 KiB as envd's JSON, and again in the e2b API's), 204.
	b.Reset()
	long := strings.Repeat("\\u0001", 10<<10)
	for i := range 300 {
		b.WriteString(`{"time":"` + epoch.Add(time.Duration(i)*time.Second).Format(time.RFC3339) + `","source":"stdout","line":"` + long + `"}` + "\n")
	}
	if err := os.WriteFile(filepath.Join(h.dir, "logs", id+".log"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, forward := range []bool{false, true} {
		if got := lines(&pb.LogsRequest{Limit: 1000, Forward: forward}); len(got) != sandboxdapi.MaxLogsAnswerBytes/(10<<10) {
			t.Errorf("forward %v: %d lines of 10 KiB, want %d", forward, len(got), sandboxdapi.MaxLogsAnswerBytes/(10<<10))
		}
	}
}
