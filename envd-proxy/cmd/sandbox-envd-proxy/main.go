// Command sandbox-envd-proxy routes e2b SDK traffic (E2B_SANDBOX_URL, or
// {port}-{id}.{domain}) to the sandboxd of the host that runs each sandbox.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/skiff-dev/skiff/envd-proxy/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cli.NewCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-envd-proxy:", err)
		os.Exit(1)
	}
}
