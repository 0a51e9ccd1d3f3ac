package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/network"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// cleanupFlags are serve's flags that name what cleanup removes.
var cleanupFlags = []string{"run-dir", "nft-table", "cgroup-parent", "iface-prefix", "sandbox-cidr"}

func cleanupCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what a stopped sandboxd keeps on the host for its next start",
		Long: `Remove what sandboxd keeps on the host between runs when no sandbox is
left: its nftables table, the sandboxes' parent cgroup, the router namespace
with its link to the host (<iface-prefix>-rt), the mount of the network
namespaces' folder under --run-dir, and the spare disks a crashed sandboxd
left mounted. Give it the flags serve ran with.

A stopped sandboxd leaves these in place on purpose: its sandboxes keep
running without it, isolated by that table, and the next serve re-adopts
them. So cleanup refuses while a sandboxd serves on --state-dir, and while
its records list any sandbox (running, paused or warm): kill them through
sandboxd's API first, or start sandboxd, which re-adopts them. The cgroup is
found relative to this process's own cgroup, as serve finds it: run cleanup
where serve ran (for example the ExecStopPost of its systemd unit).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCleanup(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	// The same flags, help and defaults as serve's.
	serveFlags := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.AddFlags(serveFlags)
	for _, name := range cleanupFlags {
		cmd.Flags().AddFlag(serveFlags.Lookup(name))
	}
	return cmd
}

func runCleanup(ctx context.Context, o *Options, out io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("cleanup needs root: it deletes an nftables table and a cgroup")
	}
	stateDir := o.Global.StateDir
	lock, err := lockStateDir(stateDir)
	if err != nil {
		return err
	}
	defer lock.Close()
	records := filepath.Join(stateDir, "records")
	if _, err := os.Stat(records); err == nil {
		st, err := store.Open(records)
		if err != nil {
			return err
		}
		recs, err := st.Load()
		if err != nil {
			return fmt.Errorf("read the sandbox records in %s: %w", records, err)
		}
		if len(recs) > 0 {
			return fmt.Errorf("%d sandboxes are recorded in %s: kill them through sandboxd's API first, or start sandboxd, which re-adopts them; nothing was removed", len(recs), records)
		}
	}
	// A sandboxd that stopped cleanly discarded its spare disks; one that
	// crashed left them mounted.
	if err := native.DiscardSpares(native.SparesDir(filepath.Join(stateDir, native.Name))); err != nil {
		return err
	}
	nm, err := network.New(o.NetworkOptions())
	if err != nil {
		return err
	}
	defer nm.Close()
	if err := nm.Remove(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "removed nftables table inet %s, the router namespace and its link %s-rt, and the mount of %s\n", o.NFTTable, o.IfacePrefix, filepath.Join(o.RunDir, "netns"))
	if err := cgroups.Remove(o.CgroupParent); err != nil {
		return fmt.Errorf("remove the sandboxes' parent cgroup %s: %w", o.CgroupParent, err)
	}
	fmt.Fprintf(out, "removed cgroup %s\n", o.CgroupParent)
	return nil
}

// lockStateDir takes the state directory's lock, which serve holds while it
// runs (released when the process ends, however it ends). It fails when
// another process holds it.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "sandboxd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another sandboxd serves --state-dir %s (it holds %s)", dir, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}
