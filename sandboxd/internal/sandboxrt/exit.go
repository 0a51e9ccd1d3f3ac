package sandboxrt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/shared/cgroups"
)

// WaitPid waits until process pid exits or ctx ends, on a pidfd through
// Go's poller, so a thousand waiting sandboxes hold no thread. alive, when
// not nil, runs once the pidfd is open and reports whether pid is still the
// process meant (not one that took a reused pid); WaitPid returns at once
// when it is not. A process that is already gone is no error.
func WaitPid(ctx context.Context, pid int, alive func() bool) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	if alive != nil && !alive() {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	err = rc.Read(func(fd uintptr) bool {
		// Readable once the process has exited.
		n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return n > 0
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// OOMKills reads how many processes the memory cgroup rel's limit killed
// (cgroup v1 memory.oom_control, v2 memory.events); -1 when unreadable.
func OOMKills(rel string) int64 {
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
