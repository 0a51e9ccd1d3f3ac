package process

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	pb "github.com/skiff-dev/skiff/envd/proto/process"
)

// subscriberBuffer is how many events a slow stream may lag behind before
// the process's output waits for it.
const subscriberBuffer = 256

// proc is one process envd started. Its output is fanned out to every stream
// attached to it (the Start stream and any Connect streams); with none
// attached, output is read and dropped, and the process runs on.
type proc struct {
	pid    uint32
	tag    *string
	config *pb.ProcessConfig
	cmd    *exec.Cmd
	user   string
	// release tells the reaper that cmd.Wait has reaped the process.
	release func()

	inMu  sync.Mutex
	stdin io.WriteCloser // nil: no stdin pipe, or closed
	pty   *os.File       // nil: not a PTY process

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *pb.ProcessEvent // set once the process has exited and its output is read
	done chan struct{}    // closed once end is set, before it is delivered

	// stopped is closed when envd kills or stops the process (SIGKILL or
	// SIGTERM): its end then comes at its exit, after at most
	// stoppedOutputGrace of its output, not when its output ends (a child
	// that left its group may hold that).
	stopped  chan struct{}
	stopOnce sync.Once
}

// stoppedOutputGrace is how long, after a killed or stopped process exits,
// its output is still read before its end is sent.
const stoppedOutputGrace = 100 * time.Millisecond

// subscriber is one attached stream.
type subscriber struct {
	events chan *pb.ProcessEvent
	gone   chan struct{} // closed when the stream detaches
}

// subscribe attaches a stream and returns it with a function to detach. The
// end event is always the last event a subscriber receives; a process that
// already ended delivers only that.
func (p *proc) subscribe() (*subscriber, func()) {
	s := &subscriber{events: make(chan *pb.ProcessEvent, subscriberBuffer), gone: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.events <- p.end
		return s, func() {}
	}
	p.subs[s] = struct{}{}
	var once sync.Once
	return s, func() {
		once.Do(func() {
			p.mu.Lock()
			delete(p.subs, s)
			p.mu.Unlock()
			close(s.gone)
		})
	}
}

// publish sends ev to every attached stream, waiting for a slow one until it
// reads or detaches.
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// finish records the end event, marks the process done, and delivers the
// event to every attached stream: a client that has the end event finds
// the process ended (SendInput and the like answer not_found).
func (p *proc) finish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	p.end = ev
	subs := p.subs
	p.subs = nil
	p.mu.Unlock()
	close(p.done)
	for s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// ended reports whether the process has exited.
func (p *proc) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process's group, so that a shell's children go
// too, or to the process alone when it left its group.
func (p *proc) signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.stopOnce.Do(func() { close(p.stopped) })
	}
	err := syscall.Kill(-int(p.pid), sig)
	if errors.Is(err, syscall.ESRCH) {
		// It left its group: the process alone, through its pidfd, so
		// never another process that took its pid once it was reaped.
		if err = p.cmd.Process.Signal(sig); errors.Is(err, os.ErrProcessDone) {
			err = syscall.ESRCH
		}
	}
	return err
}
