// Command envd is the agent inside every Skiff sandbox, wire-compatible with
// e2b's envd: the e2b SDKs run commands, move files and watch directories
// through it. It runs as the sandbox's init (PID 1): it reaps orphaned
// processes, and logs JSON lines on stdout for sandboxd (docs/envd.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"unsafe"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/envd"
	"github.com/skiff-dev/skiff/envd/internal/harden"
	"github.com/skiff-dev/skiff/envd/internal/logs"
	"github.com/skiff-dev/skiff/envd/internal/reap"
	"github.com/skiff-dev/skiff/envd/internal/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout))
}

func run(args []string, stdout io.Writer) int {
	opts := server.NewOptions()
	fs := pflag.NewFlagSet("envd", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if opts.Version {
		fmt.Fprintln(stdout, envd.Version)
		return 0
	}
	if err := opts.Complete(); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		return 2
	}

	// A log reader that goes away must not kill envd (and so the sandbox)
	// with SIGPIPE. Handled, not ignored: processes must not inherit SIG_IGN.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	defaultSignals()
	opts.Log = logs.New(stdout, logs.Config{
		Output:      opts.LogProcessOutput,
		OutputLimit: int64(opts.LogOutputLimit),
		Limit:       int64(opts.LogLimit),
	})
	logger := opts.Log.Logger()
	logger.Info("envd starting", "version", envd.Version, "init", opts.Init, "log_process_output", opts.LogProcessOutput)
	// Before anything runs in the sandbox: its root must not ptrace envd
	// or open envd's /proc files (the host's log file among its fds).
	if err := harden.NonDumpable(); err != nil {
		logger.Error("envd cannot make itself non-dumpable", "error", err.Error())
		return 1
	}
	if opts.Init {
		r, err := reap.Start()
		if err != nil {
			logger.Error("envd cannot reap orphans", "error", err.Error())
			return 1
		}
		opts.Reaper = r
	}
	// As PID 1, envd gets only the signals it handles.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	err := server.New(opts).Run(ctx)
	opts.Reaper.Close()
	if err != nil {
		logger.Error("envd failed", "error", err.Error())
		return 1
	}
	logger.Info("envd stopped", "orphans_reaped", opts.Reaper.Reaped())
	return 0
}

// defaultSignals gives back their default disposition to the signals that
// whoever started envd ignored and that Go leaves as they are (32 and up:
// GNU make, for one, runs its commands with 32 and 33 ignored). An ignored
// signal stays ignored across execve, so every process envd starts would
// inherit it. Go's runtime neither uses nor handles these signals in a
// static binary, so setting them to SIG_DFL takes nothing from it.
func defaultSignals() {
	var dfl [4]uint64 // struct sigaction: SIG_DFL, no flags, no restorer, empty mask
	for sig := 32; sig <= 64; sig++ {
		if signal.Ignored(syscall.Signal(sig)) {
			_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
		}
	}
}
