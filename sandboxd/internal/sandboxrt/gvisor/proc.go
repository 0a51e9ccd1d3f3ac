package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// alive tells whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state …; comm may hold anything, ')' included.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return false
	}
	state := data[i+2]
	return state != 'Z' && state != 'X'
}

// waitDead waits until process pid is gone (or a zombie) for at most
// timeout.
func waitDead(ctx context.Context, pid int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for delay := 100 * time.Microsecond; alive(pid); delay = min(2*delay, 20*time.Millisecond) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the sandbox process %d to end: %w", pid, ctx.Err())
		case <-time.After(delay):
		}
	}
	return nil
}

// filestoreUsage is the disk space of the file that backs the root
// overlay's upper layer of the sandbox whose sentry is pid: runsc creates
// it in dir and unlinks it at once, so only the sentry's descriptor
// reaches it. 0 when it cannot be found.
func filestoreUsage(pid int, dir string) int64 {
	if pid <= 0 {
		return 0
	}
	fds := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(fds)
	if err != nil {
		return 0
	}
	prefix := filepath.Join(dir, "runsc-filestore-")
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fds, e.Name()))
		if err != nil || !strings.HasPrefix(target, prefix) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(fds, e.Name()), &st); err != nil {
			return 0
		}
		return st.Blocks * 512
	}
	return 0
}
