package service

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/envdlog"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
	// maxLogBytes bounds a sandbox's log when it boots again on its files
	// (its envd's budget, --log-limit); keptLogBytes is what is kept of it
	// then, its newest lines.
	maxLogBytes  = 64 << 20
	keptLogBytes = 16 << 20
)

// Logs returns the lines of the sandbox's log, oldest first: the newest
// limit lines at or after start.
func (s *Service) Logs(_ context.Context, req *connect.Request[pb.LogsRequest]) (*connect.Response[pb.LogsResponse], error) {
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
	entries, err := envdlog.Read(s.logPath(rec.ID), start, limit, rec.StartedAt)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.LogsResponse{Logs: entries}), nil
}
