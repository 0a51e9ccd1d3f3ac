package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

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
	_, err = h.client.Logs(t.Context(), connect.NewRequest(&pb.LogsRequest{SandboxId: "aaaaaaaaaaaaaaaaaaaa"}))
	wantCode(t, err, connect.CodeNotFound)
}
