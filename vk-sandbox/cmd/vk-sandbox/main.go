// Command vk-sandbox runs one Skiff sandbox host as a virtual-kubelet node
// beside its sandboxd, and publishes the host's NodeInventory.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/skiff-dev/skiff/vk-sandbox/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cli.NewCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "vk-sandbox:", err)
		os.Exit(1)
	}
}
