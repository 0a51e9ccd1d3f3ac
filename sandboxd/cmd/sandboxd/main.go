// Command sandboxd runs sandboxes on a Skiff host: `sandboxd serve` is the
// daemon, `sandboxd template …` manages templates.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	// Without sandboxd-init, the native runtime starts each sandbox by
	// running this binary as "sandboxd init" (see package nsinit, which
	// the runtime imports).
	"github.com/skiff-dev/skiff/sandboxd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cli.NewCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		os.Exit(1)
	}
}
