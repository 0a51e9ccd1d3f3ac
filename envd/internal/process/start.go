package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/skiff-dev/skiff/envd/internal/identity"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
)

// start spawns the process of req as u and attaches a subscriber to it before
// any output is read, so the Start stream misses nothing.
func (s *Service) start(req *pb.StartRequest, u *identity.User) (*proc, *subscriber, func(), error) {
	cmd, err := command(req.GetProcess(), u, s.sb.Env(), s.sb.Workdir())
	if err != nil {
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	p := &proc{tag: req.Tag, config: req.GetProcess(), cmd: cmd, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}

	var outputs []output
	if size := req.GetPty().GetSize(); req.Pty != nil {
		attrs := cmd.SysProcAttr
		attrs.Setsid, attrs.Setctty = true, true
		ws := &pty.Winsize{Cols: uint16(max(size.GetCols(), 1)), Rows: uint16(max(size.GetRows(), 1))}
		ptmx, err := pty.StartWithAttrs(cmd, ws, attrs)
		if err != nil {
			return nil, nil, nil, startError(err)
		}
		p.pty = ptmx
		outputs = append(outputs, output{ptmx, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
		}})
	} else {
		cmd.SysProcAttr.Setpgid = true
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, nil, nil, startError(err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll(outR, outW)
			return nil, nil, nil, startError(err)
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		if req.Stdin == nil || req.GetStdin() { // absent means open, for old clients
			if p.stdin, err = cmd.StdinPipe(); err != nil {
				closeAll(outR, outW, errR, errW)
				return nil, nil, nil, startError(err)
			}
		}
		err = cmd.Start()
		closeAll(outW, errW) // the child has its copies
		if err != nil {
			closeAll(outR, errR)
			return nil, nil, nil, startError(err)
		}
		outputs = append(outputs,
			output{outR, func(b []byte) *pb.ProcessEvent_DataEvent {
				return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
			}},
			output{errR, func(b []byte) *pb.ProcessEvent_DataEvent {
				return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			}})
	}
	p.pid = uint32(cmd.Process.Pid)
	sub, detach := p.subscribe()

	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(p, outputs)
	}()
	return p, sub, detach, nil
}

// output is one stream of a process's output and how to wrap a chunk of it.
type output struct {
	r    *os.File
	wrap func([]byte) *pb.ProcessEvent_DataEvent
}

// run reads a started process's output until it exits, then publishes its
// end and schedules it to be forgotten.
func (s *Service) run(p *proc, outputs []output) {
	var readers sync.WaitGroup
	for _, o := range outputs {
		readers.Go(func() {
			for {
				buf := make([]byte, readChunk)
				n, err := o.r.Read(buf)
				if n > 0 {
					p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: o.wrap(buf[:n])}})
				}
				if err != nil {
					return // EOF, EIO from a PTY whose child left, or closed below
				}
			}
		})
	}
	waitErr := p.cmd.Wait()

	// Output written before the exit is in the pipes: read it, but do not
	// wait for a background child that holds them open.
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(outputGrace):
	}
	for _, o := range outputs {
		_ = o.r.Close()
	}
	<-drained

	p.inMu.Lock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	p.finish(exitEvent(p.cmd.ProcessState, waitErr))
	s.forget(p)
}

// startError maps a failure to spawn: a missing or non-executable command is
// bad input; anything else is envd's fault.
func startError(err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: %w", err))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("start process: %w", err))
}

func closeAll(cs ...io.Closer) {
	for _, c := range cs {
		_ = c.Close()
	}
}
