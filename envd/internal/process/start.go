package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/skiff-dev/skiff/envd/internal/identity"
	"github.com/skiff-dev/skiff/envd/internal/logs"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
)

// start spawns the process of req as u and attaches a subscriber to it before
// any output is read, so the Start stream misses nothing.
func (s *Service) start(req *pb.StartRequest, u *identity.User) (*proc, *subscriber, func(), error) {
	cmd, err := command(req.GetProcess(), u, s.sb.Env(), s.sb.Workdir())
	if err != nil {
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	p := &proc{tag: req.Tag, config: req.GetProcess(), cmd: cmd, user: u.Name, subs: map[*subscriber]struct{}{}, done: make(chan struct{}), stopped: make(chan struct{})}

	var outputs []output
	if size := req.GetPty().GetSize(); req.Pty != nil {
		attrs := cmd.SysProcAttr
		attrs.Setsid, attrs.Setctty = true, true
		ws := &pty.Winsize{Cols: uint16(max(size.GetCols(), 1)), Rows: uint16(max(size.GetRows(), 1))}
		var ptmx *os.File
		p.release, err = s.reaper.Spawn(s.rankedForOOM(attrs, func() (int, error) {
			f, err := pty.StartWithAttrs(cmd, ws, attrs)
			if err != nil {
				return 0, err
			}
			ptmx = f
			return cmd.Process.Pid, nil
		}))
		if err != nil {
			s.logger.Warn("process start failed", "cmd", logs.Truncate(cmd.Args[0], maxAttr), "error", logs.Truncate(err.Error(), maxAttr))
			return nil, nil, nil, startError(err)
		}
		p.pty = ptmx
		outputs = append(outputs, output{ptmx, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
		}, logs.Stdout})
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
		p.release, err = s.reaper.Spawn(s.rankedForOOM(cmd.SysProcAttr, func() (int, error) {
			if err := cmd.Start(); err != nil {
				return 0, err
			}
			return cmd.Process.Pid, nil
		}))
		closeAll(outW, errW) // the child has its copies
		if err != nil {
			closeAll(outR, errR)
			s.logger.Warn("process start failed", "cmd", logs.Truncate(cmd.Args[0], maxAttr), "error", logs.Truncate(err.Error(), maxAttr))
			return nil, nil, nil, startError(err)
		}
		outputs = append(outputs,
			output{outR, func(b []byte) *pb.ProcessEvent_DataEvent {
				return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
			}, logs.Stdout},
			output{errR, func(b []byte) *pb.ProcessEvent_DataEvent {
				return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			}, logs.Stderr})
	}
	p.pid = uint32(cmd.Process.Pid)
	sub, detach := p.subscribe()
	s.logStart(p, req.Pty != nil)

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

// output is one stream of a process's output, how to wrap a chunk of it, and
// the source of its lines in envd's log.
type output struct {
	r      *os.File
	wrap   func([]byte) *pb.ProcessEvent_DataEvent
	source logs.Source
}

// run reads a started process's output until it exits, then publishes its
// end and schedules it to be forgotten.
func (s *Service) run(p *proc, outputs []output) {
	var readers sync.WaitGroup
	for _, o := range outputs {
		readers.Go(func() {
			defer o.r.Close()
			lines := s.log.Lines(o.source, p.pid, p.pty != nil)
			defer lines.Close()
			for {
				buf := make([]byte, readChunk)
				n, err := o.r.Read(buf)
				if n > 0 {
					lines.Write(buf[:n])
					p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: o.wrap(buf[:n])}})
				}
				if err != nil {
					return // EOF, or EIO from a PTY once no process holds it
				}
			}
		})
	}
	started := time.Now()
	waitErr := p.cmd.Wait()
	p.release()

	// As e2b's envd, the process ends when its output does: a background
	// child that holds the pipes (or the terminal) keeps it running, and
	// its output goes to the streams, until the child lets go of them or
	// the process is killed or stopped (SendSignal, its Connect-Timeout-Ms,
	// envd's end). The pipes are read to their end even after that, so a
	// child left writing to them never gets EPIPE.
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-p.stopped:
		// What it wrote before its exit (a stop's last lines) is in the
		// pipes: read it, but do not wait on a child that holds them.
		select {
		case <-drained:
		case <-time.After(stoppedOutputGrace):
		}
	}

	p.inMu.Lock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	end := exitEvent(p.cmd.ProcessState, waitErr)
	s.logger.Info("process exited", "pid", p.pid, "exit_code", end.GetEnd().GetExitCode(), "status", end.GetEnd().GetStatus(),
		"duration_ms", time.Since(started).Milliseconds())
	p.finish(end)
	s.forget(p)
}

// maxAttr bounds a logged attribute that comes from a request, and
// maxArgs the logged arguments of a command, all together.
const (
	maxAttr = 1 << 10
	maxArgs = 2 << 10
)

// logStart logs a process's start: its pid, command, arguments (cut at
// maxArgs in all), user, tag and working directory; never its environment.
func (s *Service) logStart(p *proc, pty bool) {
	args := make([]string, 0, len(p.config.GetArgs()))
	budget := maxArgs
	for _, a := range p.config.GetArgs() {
		if budget <= 0 {
			args = append(args, "…")
			break
		}
		a = logs.Truncate(a, budget)
		budget -= len(a)
		args = append(args, a)
	}
	attrs := []any{"pid", p.pid, "cmd", logs.Truncate(p.config.GetCmd(), maxAttr), "args", args, "user", p.user, "cwd", logs.Truncate(p.cmd.Dir, maxAttr)}
	if p.tag != nil {
		attrs = append(attrs, "tag", logs.Truncate(*p.tag, maxAttr))
	}
	if pty {
		attrs = append(attrs, "pty", true)
	}
	s.logger.Info("process started", attrs...)
}

// startError maps a failure to spawn: a missing or non-executable command is
// bad input; anything else is envd's fault.
func startError(err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: %w", err))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("start process: %w", err))
}

// oomScoreAdj is what every process envd starts gets: the most, so that
// when the sandbox passes its memory limit the kernel's OOM killer takes a
// process of the workload, never envd. The processes inherited envd's score
// before, and a storm of processes each smaller than envd (make -j, a test
// runner) had envd killed, and with it, as the sandbox's init, every
// process and the sandbox. A process may raise its score further but not
// lower it below envd's, which sandboxd set with privilege.
const oomScoreAdj = "1000"

// rankedForOOM wraps start (a fork and exec of a command with attrs) so
// that the child has oomScoreAdj before it runs an instruction of its
// program: it starts traced (PTRACE_TRACEME, which needs no privilege), so
// the kernel stops it at its exec; envd writes its score then and lets it
// go. Writing the score once the child runs left the processes it starts at
// once (make's jobs) with envd's score; raising envd's own score for the
// fork made envd, at that moment, the OOM killer's pick in a sandbox at
// its memory limit. Where tracing is refused (gVisor refuses
// PTRACE_TRACEME), the child starts untraced and gets its score just after.
//
// It also moves the child into the sandbox's workload cgroup, if envd has
// one (SetWorkloadCgroup): there, traced, before it runs.
func (s *Service) rankedForOOM(attrs *syscall.SysProcAttr, start func() (int, error)) func() (int, error) {
	return func() (int, error) {
		// A tracee's tracer is the thread that forked it: the stop is
		// waited for and the tracee let go from this one.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		attrs.Ptrace = canTrace()
		pid, err := start()
		if err != nil {
			return pid, err
		}
		if attrs.Ptrace {
			s.releaseAtExec(pid)
		} else {
			setOOMScore(pid)
			s.toWorkload(pid)
			if s.workload != nil {
				s.untracedOnce.Do(func() {
					s.logger.Warn("processes start untraced (this host refuses PTRACE_TRACEME): each runs for a moment in envd's cgroup before its move into the workload cgroup, " +
						"and what it starts in that moment stays there")
				})
			}
		}
		return pid, nil
	}
}

// canTrace reports whether a child may ask to be traced here, found once
// by a child that asks and then executes the empty path, which no file can
// have: it reports the exec's ENOENT if the kernel granted the request,
// and the request's own error if not, and ForkExec reaps it. Nothing is
// executed
// (executing this binary to be killed at its exec cost each sandbox's
// first start a quarter of a millisecond). Callers hold their OS thread
// and run inside the reaper's Spawn.
var canTrace = sync.OnceValue(func() bool {
	_, err := syscall.ForkExec("", []string{"envd-trace-probe"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Ptrace: true}})
	return errors.Is(err, syscall.ENOENT)
})

// releaseAtExec waits for the traced child pid to stop at its exec, gives
// it its OOM score and detaches from it, so it runs on untraced. A child
// that died before its stop (killed in that instant) has been reaped here;
// its owner's Wait then reports an error rather than its status.
func (s *Service) releaseAtExec(pid int) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, syscall.WALL, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if !ws.Stopped() {
		return
	}
	setOOMScore(pid)
	s.toWorkload(pid)
	_ = syscall.PtraceDetach(pid)
}

// SetWorkloadCgroup gives envd the cgroup.procs of the sandbox's workload
// cgroup (--workload-cgroup-fd), open for writing, which every process
// Start starts is moved into: one whose pids.max leaves some of the
// sandbox's pids to envd, so that a workload holding all it may have
// cannot keep envd from the threads Go's runtime needs. Call it before
// serving.
func (s *Service) SetWorkloadCgroup(procs *os.File) { s.workload = procs }

// toWorkload moves process pid (in envd's PID namespace, as written) into
// the workload cgroup, if there is one. A process that has already ended is
// left; any other failure is logged, and the process runs on in envd's
// cgroup.
func (s *Service) toWorkload(pid int) {
	if s.workload == nil {
		return
	}
	if _, err := s.workload.WriteString(strconv.Itoa(pid)); err != nil && !errors.Is(err, syscall.ESRCH) {
		s.failedMove.Do(func() {
			s.logger.Warn("move a process into the workload cgroup; it runs in envd's (said once)", "pid", pid, "error", err)
		})
	}
}

// setOOMScore gives process pid oomScoreAdj. Failing (envd not root, in
// tests on a host) changes nothing.
func setOOMScore(pid int) {
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(oomScoreAdj), 0)
}

func closeAll(cs ...io.Closer) {
	for _, c := range cs {
		_ = c.Close()
	}
}
