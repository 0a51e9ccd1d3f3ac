// Command sandbox-apiserver serves the e2b REST API that unmodified e2b
// SDKs call, over a fleet of Skiff sandbox hosts.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/skiff-dev/skiff/apiserver/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cli.NewCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-apiserver:", err)
		os.Exit(1)
	}
}
