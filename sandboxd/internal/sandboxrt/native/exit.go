package native

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer/system"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

var _ sandboxrt.ExitWatcher = (*Runtime)(nil)

// reapWait bounds how long WaitExit waits for this process's reaper to
// collect an exit status it saw on the pidfd.
const reapWait = time.Second

// WaitExit implements sandboxrt.ExitWatcher: it waits on a pidfd of the
// sandbox's init. It works on sandboxes a previous sandboxd started too;
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
	// The pid names the init only while it has the recorded start time:
	// else the init is gone and the pid is someone else's.
	same := func() bool {
		ps, err := system.Stat(st.InitProcessPid)
		return err == nil && ps.StartTime == st.InitProcessStartTime && ps.State != system.Zombie && ps.State != system.Dead
	}
	if err := sandboxrt.WaitPid(ctx, st.InitProcessPid, same); err != nil {
		if ctx.Err() != nil {
			return sandboxrt.Exit{}, ctx.Err()
		}
		return sandboxrt.Exit{}, fmt.Errorf("sandbox %s: wait for its init: %w", id, err)
	}
	return r.exitOf(id), nil
}

// exitOf is what is known of how sandbox id's init ended: its status when
// this process reaps it, and the OOM kills its memory cgroup counted.
func (r *Runtime) exitOf(id string) sandboxrt.Exit {
	e := sandboxrt.Exit{OOMKills: sandboxrt.OOMKills(filepath.Join(r.opts.CgroupParent, id))}
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
