package service

import (
	"context"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/sandboxd/internal/envdlog"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
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
	// maxLogSearch bounds a search's text (e2b's API takes 256 bytes).
	maxLogSearch = 4 << 10
)

// Logs returns lines of the sandbox's log, oldest first: the newest (or,
// forward, the oldest) limit lines of the window from start to end that
// pass its filters, fewer when their text passes
// sandboxdapi.MaxLogsAnswerBytes.
func (s *Service) Logs(ctx context.Context, req *connect.Request[pb.LogsRequest]) (*connect.Response[pb.LogsResponse], error) {
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
	q := envdlog.Query{Limit: min(limit, maxLogLimit), Forward: m.GetForward(), MinLevel: m.GetMinLevel(), Search: m.GetSearch(), MaxBytes: sandboxdapi.MaxLogsAnswerBytes,
		Skip: int(m.GetSkip())}
	switch {
	case q.Skip < 0:
		f.add("skip", "must not be negative, got %d", q.Skip)
	case q.Skip > 0 && !q.Forward:
		f.add("skip", "only with forward")
	}
	for _, t := range []struct {
		name string
		ts   *timestamppb.Timestamp
		to   *time.Time
	}{{"start", m.GetStart(), &q.Start}, {"end", m.GetEnd(), &q.End}} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			f.add(t.name, "%v", err)
		} else {
			*t.to = t.ts.AsTime()
		}
	}
	if q.MinLevel != "" && !slices.Contains(envdlog.Levels, q.MinLevel) {
		f.add("min_level", "must be one of %s, got %q", strings.Join(envdlog.Levels, ", "), q.MinLevel)
	}
	if len(q.Search) > maxLogSearch {
		f.add("search", "must be at most %d bytes, got %d", maxLogSearch, len(q.Search))
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	rec, err := s.reg.Get(m.GetSandboxId())
	if err != nil {
		return nil, toConnect(err)
	}
	entries, err := envdlog.Read(ctx, s.logPath(rec.ID), q, rec.StartedAt)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.LogsResponse{Logs: entries, Skipped: int32(q.Skip)}), nil //nolint:gosec // from an int32
}
