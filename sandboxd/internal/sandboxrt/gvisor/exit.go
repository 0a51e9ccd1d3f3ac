package gvisor

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

var _ sandboxrt.ExitWatcher = (*Runtime)(nil)

// WaitExit implements sandboxrt.ExitWatcher: it waits on a pidfd of the
// sandbox's runsc process (gVisor's kernel, envd inside it), which ends
// with the sandbox: when envd dies, and when the sandbox is checkpointed
// (Pause), which the caller tells apart by Status. A sandbox paused to
// disk has no process: that is an error, at once. runsc's sandbox
// process is not this one's child, so its exit status is not known.
func (r *Runtime) WaitExit(ctx context.Context, id string) (sandboxrt.Exit, error) {
	s, st, err := r.status(ctx, id)
	if err != nil {
		return sandboxrt.Exit{}, err
	}
	if s != sandboxrt.Running || st == nil || st.Pid <= 0 {
		return sandboxrt.Exit{}, fmt.Errorf("sandbox %s: no process to watch (%s)", id, s)
	}
	if err := sandboxrt.WaitPid(ctx, st.Pid, func() bool { return alive(st.Pid) }); err != nil {
		if ctx.Err() != nil {
			return sandboxrt.Exit{}, ctx.Err()
		}
		return sandboxrt.Exit{}, fmt.Errorf("sandbox %s: wait for runsc: %w", id, err)
	}
	return sandboxrt.Exit{OOMKills: sandboxrt.OOMKills(filepath.Join(r.opts.CgroupParent, id))}, nil
}
