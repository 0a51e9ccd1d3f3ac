package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/skiff-dev/skiff/shared/nodetoken"
)

// nodeTokenOptions are the flags of `node-token`.
type nodeTokenOptions struct {
	keyFile string
}

func (o *nodeTokenOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.keyFile, "key-file", o.keyFile, "The fleet key file, the one serve --node-token-key-file reads: its content without surrounding white space, at least 32 bytes. Required.")
}

// Validate reports every option and argument that cannot work, naming its
// flag.
func (o *nodeTokenOptions) Validate(node string) error {
	var errs []error
	if o.keyFile == "" {
		errs = append(errs, errors.New("--key-file is required"))
	}
	if msgs := validation.IsDNS1123Subdomain(node); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("node %q: a node name is a NodeInventory's name: %s", node, strings.Join(msgs, "; ")))
	}
	return errors.Join(errs...)
}

func nodeTokenCommand() *cobra.Command {
	o := &nodeTokenOptions{}
	cmd := &cobra.Command{
		Use:   "node-token --key-file FILE NODE",
		Short: "Print the token that one host's sandboxd accepts under the fleet key",
		Long: `Print the node token of the host whose node is NODE (its sandboxd's and
vk-sandbox's --node-name): hex(HMAC-SHA256(key, NODE)), the token that
serve --node-token-key-file sends that host. Write it to the host's token
file (sandboxd --auth-token-file, vk-sandbox --sandboxd-token-file); give
the host nothing else, so that it holds its own token only.

  sandbox-apiserver node-token --key-file /etc/skiff/node-token-key host-a > token`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			if err := o.Validate(node); err != nil {
				return err
			}
			key, err := nodetoken.ReadKeyFile("--key-file", o.keyFile)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), nodetoken.Derive(key, node))
			return err
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}
