package system_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
	"github.com/skiff-dev/skiff/shared/cgroups"
	"github.com/skiff-dev/skiff/shared/mountinfo"
)

// A test's or benchmark's system (Disposable) leaves nothing on the host
// even when its Stop cannot kill the sandboxes through sandboxd: the
// sandboxes' processes end, and their mounts, cgroups and the nftables
// table go. (make up's keeps them for its next start instead.)
func TestDisposableStopLeavesNothing(t *testing.T) {
	sys := systemtest.Start(t, "team-a")
	cfg := sys.Config()
	if !cfg.Disposable {
		t.Fatal("a test's system is not Disposable")
	}
	api := newAPIClient(sys.Keys["team-a"])
	for range 2 {
		code, body, err := api.call(t.Context(), http.MethodPost, sys.APIURL+"/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 300}, nil)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create: %d %s %v", code, body, err)
		}
	}
	paths, err := cgroups.Paths(cfg.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]bool{} // the same in each hierarchy of cgroup v1
	for _, p := range paths {
		_ = filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				data, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
				for f := range strings.FieldsSeq(string(data)) {
					pid, _ := strconv.Atoi(f)
					pids[pid] = true
				}
			}
			return nil
		})
	}
	if len(pids) < 2 {
		t.Fatalf("the sandboxes' cgroups %v hold processes %v; want each sandbox's init at least", paths, pids)
	}
	if mounts := mountsUnder(t, cfg.State); len(mounts) == 0 {
		t.Fatalf("no mount under %s with two sandboxes running", cfg.State)
	}

	// A cancelled context: Stop cannot call sandboxd to kill them.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = sys.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "kill the sandboxes through sandboxd") {
		t.Fatalf("Stop = %v; want the failed kill reported", err)
	}
	if strings.Contains(err.Error(), "kept") {
		t.Errorf("Stop kept resources of a disposable system: %v", err)
	}
	for pid := range pids {
		// Gone, or dead and not yet reaped by whoever inherited it.
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if _, rest, _ := strings.Cut(string(stat), ") "); err == nil && !strings.HasPrefix(rest, "Z") {
			t.Errorf("process %d of a sandbox is still there: %s", pid, stat)
		}
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s is still there (%v)", p, err)
		}
	}
	if out, err := exec.Command("nft", "list", "table", "inet", cfg.NFTTable).CombinedOutput(); err == nil {
		t.Errorf("nftables table %s is still there:\n%s", cfg.NFTTable, out)
	}
	if mounts := mountsUnder(t, cfg.State); len(mounts) > 0 {
		t.Errorf("mounts left under %s: %v", cfg.State, mounts)
	}
	if err := os.RemoveAll(cfg.State); err != nil {
		t.Errorf("remove the state directory: %v", err)
	}
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	return mounts
}
