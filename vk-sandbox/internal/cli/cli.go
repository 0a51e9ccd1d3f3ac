// Package cli is vk-sandbox's command line: `serve` runs one sandbox host
// as a virtual-kubelet node beside its sandboxd, and publishes the host's
// NodeInventory.
package cli

import (
	"github.com/spf13/cobra"
)

// NewCommand returns the vk-sandbox command.
func NewCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "vk-sandbox",
		Short:         "A Skiff sandbox host as a virtual-kubelet node, and the publisher of its NodeInventory",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand())
	return root
}
