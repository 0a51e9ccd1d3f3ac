package filesystem

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/skiff-dev/skiff/envd/proto/filesystem"
)

// The Python SDK before 1.7.1 named itself with this User-Agent and read
// the filesystem service's answers strictly: a field it did not know (any
// of an entry's after its name, type and path; an event's entry) failed
// the call. e2b's envd answers it with those fields left out, and says so
// in legacyHeader; so does this one (e2b's services/legacy).
const (
	legacyUserAgent = "connect-python"
	legacyHeader    = "X-E2B-Legacy-SDK"
)

// Legacy is the filesystem handler's interceptor that trims its answers for
// the Python SDK before 1.7.1.
func Legacy() connect.Interceptor { return legacy{} }

type legacy struct{}

func (legacy) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil || req.Header().Get("User-Agent") != legacyUserAgent {
			return resp, err
		}
		resp.Header().Set(legacyHeader, "true")
		trimLegacy(resp.Any())
		return resp, nil
	}
}

func (legacy) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (legacy) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if conn.RequestHeader().Get("User-Agent") != legacyUserAgent {
			return next(ctx, conn)
		}
		conn.ResponseHeader().Set(legacyHeader, "true")
		return next(ctx, legacyConn{conn})
	}
}

// legacyConn trims what a stream sends.
type legacyConn struct{ connect.StreamingHandlerConn }

func (c legacyConn) Send(msg any) error {
	trimLegacy(msg)
	return c.StreamingHandlerConn.Send(msg)
}

// trimLegacy leaves in msg, an answer made for this call alone, only what
// the old SDK knows: of an entry its name, type and path, of an event its
// name and type.
func trimLegacy(msg any) {
	switch m := msg.(type) {
	case *filesystem.StatResponse:
		trimEntry(m.GetEntry())
	case *filesystem.MakeDirResponse:
		trimEntry(m.GetEntry())
	case *filesystem.MoveResponse:
		trimEntry(m.GetEntry())
	case *filesystem.ListDirResponse:
		for _, e := range m.GetEntries() {
			trimEntry(e)
		}
	case *filesystem.WatchDirResponse:
		if ev := m.GetFilesystem(); ev != nil {
			ev.Entry = nil
		}
	case *filesystem.GetWatcherEventsResponse:
		for _, ev := range m.GetEvents() {
			ev.Entry = nil
		}
	}
}

func trimEntry(e *filesystem.EntryInfo) {
	if e == nil {
		return
	}
	name, typ, path := e.GetName(), e.GetType(), e.GetPath()
	proto.Reset(e)
	e.Name, e.Type, e.Path = name, typ, path
}
