// Package cli is sandbox-apiserver's command line: `serve` runs the e2b
// REST API over the fleet, either single-host (--inventory static: the
// --sandboxd hosts, a keys file) or over Kubernetes (--inventory kube:
// NodeInventories, SandboxTemplates and API-key Secrets through one
// informer cache), and its operations endpoints (/metrics, /healthz,
// /readyz, opt-in pprof) on --admin-listen; `keys create` makes an API key,
// as a Secret or in a keys file; `node-token` prints a host's node token
// under the fleet key.
package cli

import (
	"github.com/spf13/cobra"
)

// NewCommand returns the sandbox-apiserver command.
func NewCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "sandbox-apiserver",
		Short:         "The e2b-compatible API of a Skiff fleet",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCommand(), keysCommand(), nodeTokenCommand())
	return root
}
