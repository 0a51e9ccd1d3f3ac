// Command envd is the agent inside every Skiff sandbox, wire-compatible with
// e2b's envd: the e2b SDKs run commands, move files and watch directories
// through it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/envd"
	"github.com/skiff-dev/skiff/envd/internal/server"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	opts := server.NewOptions()
	fs := pflag.NewFlagSet("envd", pflag.ContinueOnError)
	version := fs.Bool("version", false, "Print the envd version and exit.")
	opts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Println(envd.Version)
		return 0
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := server.New(opts).Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		return 1
	}
	return 0
}
