// Command skiff-fleetsim measures Skiff's control plane against a
// simulated fleet (issue 21): a real etcd and kube-apiserver, --hosts
// simulated sandbox hosts of --sandboxes-per-host sandboxes each
// publishing real NodeInventories on the real cadence, and the real
// sandbox-apiserver and sandbox-envd-proxy of --bin. It prints a table and
// appends JSON lines to --out (package fleetbench says what is measured),
// and stops by itself, leaving nothing running, also on failure, past
// --timeout and on Ctrl-C. `make bench-fleet` builds and runs it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/e2e/internal/fleetbench"
	"github.com/skiff-dev/skiff/e2e/internal/harness"
)

func main() { os.Exit(run()) }

func run() int {
	o := fleetbench.NewOptions()
	fs := pflag.NewFlagSet("skiff-fleetsim", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "skiff-fleetsim:", err)
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "skiff-fleetsim:", err)
		return 2
	}
	if o.LogDir == "" {
		dir, err := os.MkdirTemp("", "skiff-fleetsim-logs-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "skiff-fleetsim:", err)
			return 1
		}
		o.LogDir = dir
	}
	logFile, err := os.OpenFile(filepath.Join(o.LogDir, "fleetsim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-fleetsim:", err)
		return 1
	}
	defer logFile.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop() // a second Ctrl-C kills at once
			fmt.Fprintln(os.Stderr, "skiff-fleetsim: stopping and cleaning up (Ctrl-C again to kill at once):", ctx.Err())
		case <-done:
		}
	}()
	err = harness.Run(ctx, "fleetsim", logFile, func(tb *harness.TB) error {
		rep, err := fleetbench.Run(tb, o, os.Stderr)
		if rep != nil {
			rep.Print(os.Stdout)
			if o.Out != "" {
				if werr := rep.AppendJSON(o.Out); werr != nil {
					err = errors.Join(err, werr)
				}
			}
		}
		return err
	})
	close(done)
	if err != nil {
		fmt.Fprintf(os.Stderr, "skiff-fleetsim: %v (logs in %s)\n", err, o.LogDir)
		return 1
	}
	return 0
}
