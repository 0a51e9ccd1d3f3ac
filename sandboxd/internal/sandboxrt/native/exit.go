package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer/system"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

var _ sandboxrt.ExitWatcher = (*Runtime)(nil)

// reapWait bounds how long WaitExit waits for this process's reaper to
// collect an exit status it saw on the pidfd.
const reapWait = time.Second

// WaitExit implements sandboxrt.ExitWatcher: it waits on a pidfd of the
// sandbox's init, through Go's poller, so a thousand waiting sandboxes
// hold no thread. It works on sandboxes a previous sandboxd started too;
// their exit status is not known (the host's init reaps them).
func (r *Runtime) WaitExit(ctx context.Context, id string) (sandboxrt.Exit, error) {
	c, err := r.load(id)
	if err != nil {
		return sandboxrt.Exit{}, err
	}
	st, err := c.State()
	if err != nil {
		return sandboxrt.Exit{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	fd, err := unix.PidfdOpen(st.InitProcessPid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return r.exitOf(id), nil
	}
	if err != nil {
		return sandboxrt.Exit{}, fmt.Errorf("sandbox %s: pidfd of its init: %w", id, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	// The pid names the init only while it has the recorded start time:
	// else the init is gone and the pid is someone else's.
	if ps, err := system.Stat(st.InitProcessPid); err != nil || ps.StartTime != st.InitProcessStartTime || ps.State == system.Zombie || ps.State == system.Dead {
		return r.exitOf(id), nil
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return sandboxrt.Exit{}, err
	}
	err = rc.Read(func(fd uintptr) bool {
		// Readable once the process has exited.
		n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return n > 0
	})
	if ctx.Err() != nil {
		return sandboxrt.Exit{}, ctx.Err()
	}
	if err != nil {
		return sandboxrt.Exit{}, fmt.Errorf("sandbox %s: wait for its init: %w", id, err)
	}
	return r.exitOf(id), nil
}

// exitOf is what is known of how sandbox id's init ended: its status when
// this process reaps it, and the OOM kills its memory cgroup counted.
func (r *Runtime) exitOf(id string) sandboxrt.Exit {
	e := sandboxrt.Exit{OOMKills: oomKills(filepath.Join(r.opts.CgroupParent, id))}
	r.mu.Lock()
	reaped := r.reaped[id]
	r.mu.Unlock()
	if reaped == nil {
		return e
	}
	select {
	case ps := <-reaped:
		reaped <- ps // for a later call
		if ps == nil {
			break
		}
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			e.Known = true
			if ws.Signaled() {
				e.Signal = ws.Signal()
			} else {
				e.Code = ws.ExitStatus()
			}
		}
	case <-time.After(reapWait):
	}
	return e
}

// oomKills reads how many processes the memory cgroup rel's limit killed
// (cgroup v1 memory.oom_control, v2 memory.events); -1 when unreadable.
func oomKills(rel string) int64 {
	dir, err := cgroups.ControllerPath(rel, "memory")
	if err != nil {
		return -1
	}
	for _, name := range []string{"memory.oom_control", "memory.events"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "oom_kill "); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}
