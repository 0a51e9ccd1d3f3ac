package system

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/skiff-dev/skiff/shared/spawn"
)

// How a server that exits on its own is restarted: after minBackoff, then
// twice as long each time up to maxBackoff; a run of backoffReset or more
// starts again at minBackoff.
const (
	minBackoff   = time.Second
	maxBackoff   = 30 * time.Second
	backoffReset = time.Minute
)

// proc is one server and its current run. A server that exits on its own
// after Start is restarted (supervise): sandboxd re-adopts its sandboxes
// on start, and the apiserver and the proxy follow it again, so a crash
// costs seconds. Tearing down instead would remove sandboxd's nftables
// table while its sandboxes still run.
type proc struct {
	name string
	bin  string
	args []string
	env  []string // added to this process's environment
	log  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has exited
	started  time.Time
	restarts int
}

// run starts the server once more, its output appended to its log (the
// first run truncates it).
func (p *proc) run(first bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
	if first {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(p.log, flags, 0o644)
	if err != nil {
		return fmt.Errorf("open %s's log: %w", p.name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a terminal's Ctrl-C reaches only us, and we
	// stop the servers in order. If we die without stopping them (SIGKILL,
	// a test binary's timeout), each gets SIGTERM and stops itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := spawn.Start(cmd, syscall.SIGTERM); err != nil {
		_ = f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = f.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done, p.started = cmd, done, time.Now()
	p.mu.Unlock()
	return nil
}

// current returns the current run: its command, the channel closed when
// it exits, and when it started.
func (p *proc) current() (*exec.Cmd, <-chan struct{}, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done, p.started
}

// pid is the current run's process ID.
func (p *proc) pid() int {
	cmd, _, _ := p.current()
	return cmd.Process.Pid
}

// stop ends the current run: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	cmd, done, _ := p.current()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// supervise restarts every server that exits on its own until Stop, each
// restart after a bounded backoff and with a line on Progress that says
// which server, why it exited and how long it had run.
func (s *System) supervise() {
	s.quit = make(chan struct{})
	for _, p := range s.procs {
		s.supervisors.Go(func() { s.keepRunning(p) })
	}
}

func (s *System) keepRunning(p *proc) {
	backoff := minBackoff
	for {
		cmd, done, started := p.current()
		select {
		case <-s.quit:
			return
		case <-done:
		}
		select {
		case <-s.quit: // Stop ended it
			return
		default:
		}
		ran := time.Since(started).Round(time.Millisecond)
		if ran >= backoffReset {
			backoff = minBackoff
		}
		why := cmd.ProcessState.String()
		s.progressf("%s exited (%s) after %s; restarting it in %s", p.name, why, ran, backoff)
		for {
			select {
			case <-s.quit:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			appendLine(p.log, fmt.Sprintf("--- skiff-up: %s exited (%s) after %s; restarted ---", p.name, why, ran))
			err := p.run(false)
			if err == nil {
				break
			}
			s.progressf("restart %s: %v; trying again in %s", p.name, err, backoff)
		}
		p.mu.Lock()
		p.restarts++
		p.mu.Unlock()
		s.progressf("restarted %s (pid %d)", p.name, p.pid())
	}
}

// progressf writes a line on Progress; supervisors write from their own
// goroutines.
func (s *System) progressf(format string, args ...any) {
	s.progressMu.Lock()
	defer s.progressMu.Unlock()
	fmt.Fprintf(s.cfg.Progress, format+"\n", args...)
}

// stopSupervising stops the restarts and waits for the supervisors; the
// servers keep running.
func (s *System) stopSupervising() {
	if s.quit == nil {
		return
	}
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	s.supervisors.Wait()
}

// PID returns the process ID of a server's current run, 0 for an unknown
// name.
func (s *System) PID(name string) int {
	for _, p := range s.procs {
		if p.name == name {
			return p.pid()
		}
	}
	return 0
}

// Restarts returns how often a server was restarted after exiting on its
// own.
func (s *System) Restarts(name string) int {
	for _, p := range s.procs {
		if p.name == name {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.restarts
		}
	}
	return 0
}

// appendLine adds a line to a log file, best effort.
func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	_, _ = io.WriteString(f, line+"\n")
	_ = f.Close()
}
