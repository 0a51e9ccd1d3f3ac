// Package process is envd's process.Process service: it starts processes as
// a sandbox user, streams their output to every attached client, and keeps
// them running when a client goes away, so that a later Connect re-attaches.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/skiff-dev/skiff/envd/internal/keepalive"
	"github.com/skiff-dev/skiff/envd/internal/logs"
	"github.com/skiff-dev/skiff/envd/internal/reap"
	"github.com/skiff-dev/skiff/envd/internal/state"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
)

// retainEnded is how long an exited process stays reachable by Connect, so a
// client that reconnects late still gets its end event.
const retainEnded = 5 * time.Minute

// readChunk is the most output one data event carries.
const readChunk = 32 << 10

// Service implements processconnect.ProcessHandler.
type Service struct {
	sb     *state.Sandbox
	log    *logs.Log
	logger *slog.Logger
	reaper *reap.Reaper
	// workload is the sandbox's workload cgroup's cgroup.procs, or nil;
	// each warning about it is logged once.
	workload                 *os.File
	untracedOnce, failedMove sync.Once

	mu    sync.Mutex
	procs map[uint32]*proc // running, and ended within retainEnded
	wg    sync.WaitGroup   // one per process: its waiter and output readers
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// New returns a Service that starts processes with sb's defaults. It logs
// their start and exit to log, and their output when log says so. With a
// reaper (envd is init), it registers every process it starts, so that the
// reaper leaves their exit statuses to it; reaper may be nil.
func New(sb *state.Sandbox, log *logs.Log, reaper *reap.Reaper) *Service {
	if log == nil {
		log = logs.Discard()
	}
	return &Service{sb: sb, log: log, logger: log.Logger(), reaper: reaper, procs: map[uint32]*proc{}}
}

// Close kills every running process and waits until each has ended.
func (s *Service) Close() {
	s.mu.Lock()
	for _, p := range s.procs {
		if !p.ended() {
			_ = p.signal(syscall.SIGKILL)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Start starts a process and streams its events: start (always first), data,
// keepalives while idle, and end. The request's Connect-Timeout-Ms is the
// process's lifetime: when it passes, the process is killed and the stream
// ends with deadline_exceeded. A client that disconnects leaves the process
// running.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	u, err := s.sb.RequestUser(req.Header())
	if err != nil {
		return connect.NewError(connect.CodeUnauthenticated, err)
	}
	p, sub, detach, err := s.start(req.Msg, u)
	if err != nil {
		return err
	}
	defer detach()
	if err := stream.Send(&pb.StartResponse{Event: startEvent(p.pid)}); err != nil {
		return err
	}
	// The deadline is the process's lifetime, whether or not the client is
	// still there when it passes.
	if deadline, ok := ctx.Deadline(); ok {
		t := time.AfterFunc(time.Until(deadline), func() { _ = p.signal(syscall.SIGKILL) })
		go func() { <-p.done; t.Stop() }()
	}
	return s.follow(ctx, req.Header(), sub, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect re-attaches to a process by pid or tag: a start event, then its
// output from now on, then its end (at once, for a process that ended).
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub, detach := p.subscribe()
	defer detach()
	if err := stream.Send(&pb.ConnectResponse{Event: startEvent(p.pid)}); err != nil {
		return err
	}
	return s.follow(ctx, req.Header(), sub, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// List returns the running processes.
func (s *Service) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &pb.ListResponse{}
	for _, p := range s.procs {
		if !p.ended() {
			out.Processes = append(out.Processes, &pb.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
		}
	}
	return connect.NewResponse(out), nil
}

// Update resizes a PTY process's terminal.
func (s *Service) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if p.pty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process with pid %d has no pty", p.pid))
		}
		if err := pty.Setsize(p.pty, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}); err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize pty: %w", err))
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// SendInput writes to a process's stdin or PTY.
func (s *Service) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := write(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput writes a client stream of input to one process: a start event
// selecting it, then data events.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := s.findRunning(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before the start event"))
			}
			if err := write(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process and its group.
func (s *Service) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %s", req.Msg.GetSignal()))
	}
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.signal(sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// CloseStdin closes a process's stdin, so that it reads EOF. A process whose
// stdin is not open (started with stdin false, the SDK's default for
// commands.run, or closed already) has nothing to close: that succeeds, as
// with e2b's envd. A PTY has no separate stdin: send Ctrl-D (0x04) as input
// instead.
func (s *Service) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process with pid %d is a pty: send Ctrl-D (0x04) as input instead", p.pid))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return connect.NewResponse(&pb.CloseStdinResponse{}), nil
	}
	err = p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("close stdin of process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// follow relays a subscriber's events to send until the end event, adding a
// keepalive after each idle interval. It returns nil after the end event,
// and the context's error (deadline_exceeded or canceled) if it ends first.
func (s *Service) follow(ctx context.Context, h http.Header, sub *subscriber, send func(*pb.ProcessEvent) error) error {
	interval := keepalive.Interval(h)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case ev := <-sub.events:
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
			timer.Reset(interval)
		case <-timer.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			timer.Reset(interval)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

// write sends input to a process's stdin or PTY.
func write(p *proc, in *pb.ProcessInput) error {
	var w io.Writer
	var data []byte
	p.inMu.Lock()
	defer p.inMu.Unlock()
	switch in := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.pty == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process with pid %d has no pty", p.pid))
		}
		w, data = p.pty, in.Pty
	case *pb.ProcessInput_Stdin:
		if p.stdin == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process with pid %d has no open stdin", p.pid))
		}
		w, data = p.stdin, in.Stdin
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input is empty"))
	}
	if _, err := w.Write(data); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write input to process %d: %w", p.pid, err))
	}
	return nil
}

// find returns a process, running or recently ended, by pid or tag.
func (s *Service) find(sel *pb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch sel := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[sel.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", sel.Pid))
	case *pb.ProcessSelector_Tag:
		var found *proc
		for _, p := range s.procs {
			// Prefer a running process over an ended one with the same tag.
			if p.tag != nil && *p.tag == sel.Tag && (found == nil || found.ended()) {
				found = p
			}
		}
		if found != nil {
			return found, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", sel.Tag))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is empty: set pid or tag"))
	}
}

// findRunning is find for a process that has not ended.
func (s *Service) findRunning(sel *pb.ProcessSelector) (*proc, error) {
	p, err := s.find(sel)
	if err != nil {
		return nil, err
	}
	if p.ended() {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", p.pid))
	}
	return p, nil
}

// forget drops an ended process once retainEnded has passed.
func (s *Service) forget(p *proc) {
	time.AfterFunc(retainEnded, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.procs[p.pid] == p {
			delete(s.procs, p.pid)
		}
	})
}

// exitEvent describes how a process ended, as e2b's envd does: exitCode
// (omitted when 0; -1 when killed by a signal), exited, status, and error
// for anything but a clean exit.
func exitEvent(state *os.ProcessState, waitErr error) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{}
	if state != nil {
		end.ExitCode = int32(state.ExitCode())
		end.Exited = state.Exited()
		end.Status = state.String()
	}
	if waitErr != nil {
		msg := waitErr.Error()
		end.Error = &msg
		if end.Status == "" {
			end.Status = msg
			end.ExitCode = -1
		}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}
