// Package cli is sandbox-envd-proxy's command line: `serve` runs the proxy.
package cli

import (
	"github.com/spf13/cobra"
)

// NewCommand returns the sandbox-envd-proxy command.
func NewCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "sandbox-envd-proxy",
		Short:         "The data-plane edge of a Skiff fleet: e2b SDK traffic to the sandbox's host",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand())
	return root
}
