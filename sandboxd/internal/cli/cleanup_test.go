package cli

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/network"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/shared/cgroups"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// cleanup removes the table, the cgroup and the netns mount a stopped
// sandboxd left, and refuses while a sandboxd holds the state directory or
// sandboxes are recorded.
func TestCleanup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: nftables and cgroups")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("nft is needed (apt-get install nftables)")
	}
	suffix := fmt.Sprintf("%04x", rand.IntN(0xffff))
	table, cgroup, prefix := "skiff_cleanup_"+suffix, "skiff-cleanup-"+suffix, "c"+suffix
	cidr := fmt.Sprintf("10.%d.%d.0/24", 100+rand.IntN(100), rand.IntN(256))
	state, runDir := t.TempDir(), t.TempDir()
	// What serve's Init leaves: the table, the netns mount, the router
	// namespace and its link to the host.
	o := NewOptions()
	o.NFTTable, o.RunDir, o.IfacePrefix, o.SandboxCIDR = table, runDir, prefix, cidr
	nm, err := network.New(o.NetworkOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := nm.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	_ = nm.Close()
	t.Cleanup(func() {
		_ = exec.Command("nft", "delete", "table", "inet", table).Run()
		_ = exec.Command("ip", "link", "delete", prefix+"-rt").Run()
		_ = syscall.Unmount(filepath.Join(runDir, "netns", ".router"), syscall.MNT_DETACH)
		_ = syscall.Unmount(filepath.Join(runDir, "netns"), syscall.MNT_DETACH)
	})
	paths, err := cgroups.Paths(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = cgroups.Remove(cgroup) })
	args := []string{"--state-dir", state, "cleanup", "--nft-table", table, "--cgroup-parent", cgroup, "--run-dir", runDir, "--iface-prefix", prefix, "--sandbox-cidr", cidr}

	// A sandboxd serving on the state directory.
	lock, err := lockStateDir(state)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "another sandboxd serves") {
		t.Fatalf("cleanup beside a serving sandboxd = %v, want refused", err)
	}
	_ = lock.Close()

	// A recorded sandbox.
	st, err := store.Open(filepath.Join(state, "records"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := sandboxid.New(sandboxid.NodeTag("host-x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(&store.Record{ID: id, Template: "base", State: "running", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "1 sandboxes are recorded") {
		t.Fatalf("cleanup with a recorded sandbox = %v, want refused", err)
	}
	if err := exec.Command("nft", "list", "table", "inet", table).Run(); err != nil {
		t.Fatal("a refused cleanup removed the table")
	}

	// Nothing left: everything goes.
	if err := st.Delete(id); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if !strings.Contains(out, "removed nftables table inet "+table) || !strings.Contains(out, "removed cgroup "+cgroup) {
		t.Errorf("cleanup said %q", out)
	}
	if err := exec.Command("nft", "list", "table", "inet", table).Run(); err == nil {
		t.Error("the table is still there")
	}
	if _, err := net.InterfaceByName(prefix + "-rt"); err == nil {
		t.Errorf("the router's link %s-rt is still there", prefix)
	}
	if _, err := os.Stat(filepath.Join(runDir, "netns", ".router")); !os.IsNotExist(err) {
		t.Errorf("the router namespace's file: %v, want gone", err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("cgroup %s: %v, want gone", p, err)
		}
	}
	// Again: nothing to remove is no error.
	if out, err := run(t, args...); err != nil {
		t.Fatalf("cleanup again: %v\n%s", err, out)
	}
}
