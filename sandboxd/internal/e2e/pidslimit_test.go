package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// A sandbox whose processes hold every pid they may have keeps its envd:
// they may have all but 64 of the 256 here (a quarter), which stay for
// envd, and envd answers requests that need more of its own threads than
// it had running; the sandbox does not die. (Go's runtime ends a program
// that cannot start a thread it needs; before the workload had a limit of
// its own, envd, the sandbox's init, took the sandbox with it when its
// files were read at that moment.)
func TestEnvdOutlivesAFullPidsLimit(t *testing.T) {
	const limit, workload = 256, 192
	h := newHostWith(t, func(lib *template.Library) (*template.Template, error) {
		rootfs := sandboxtest.BusyboxRootfs(t)
		sandboxtest.InstallHog(t, rootfs)
		return lib.ImportDir("busybox", rootfs)
	}, "--pids-limit", strconv.Itoa(limit))
	sb := h.create(nil)
	id, token := sb.GetSandbox().GetId(), sb.GetEnvdAccessToken()
	pid := h.initPid(id)
	threads := func() int {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			t.Fatalf("envd's threads: %v", err)
		}
		return len(tasks)
	}
	before := threads()

	h.mustRun(id, token, "user", "(hog procs 100000 hold >/tmp/procs.out 2>&1 &) ; echo started")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		got, _ := h.envd(id).ReadFile(ctx, "user", token, "/tmp/procs.out")
		if n, _, ok := sandboxtest.ParseHog(got); ok {
			// The hog itself and the shells that started it count too.
			t.Logf("the sandbox's processes: %s", strings.TrimSpace(got))
			if n > workload || n < workload-8 {
				t.Fatalf("the workload holds %d processes; its limit is %d", n, workload)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the hog did not reach the pids limit: %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Many requests at once, each a goroutine of envd's reading a file: more
	// than the threads envd ran before need to be in the kernel together.
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	end := time.Now().Add(5 * time.Second)
	for range 64 {
		wg.Go(func() {
			for time.Now().Before(end) {
				rctx, rcancel := context.WithTimeout(ctx, answerBound)
				_, err := h.envd(id).ReadFile(rctx, "user", token, "/tmp/procs.out")
				rcancel()
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if !h.envdRunning(id) {
		t.Fatalf("the sandbox's envd is gone (%d reads answered, %d failed); sandboxd's log:\n%s", ok.Load(), failed.Load(), h.logTail())
	}
	t.Logf("envd's threads: %d before, %d after; %d reads answered, %d failed", before, threads(), ok.Load(), failed.Load())
	if got, err := h.envd(id).ReadFile(ctx, "user", token, "/tmp/procs.out"); err != nil || !strings.Contains(got, "got=") {
		t.Fatalf("envd, after: %q, %v", got, err)
	}
}
