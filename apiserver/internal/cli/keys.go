package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
)

func keysCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage the API keys that e2b SDKs send as E2B_API_KEY"}
	var team, file string
	create := &cobra.Command{
		Use:   "create --team TEAM --api-keys-file FILE",
		Short: "Create a key for a team and print it (the only time it is shown)",
		Long: `Create a key for a team and print it. The key is appended to the keys
file (one "team key" per line) that a running sandbox-apiserver reloads on
change. With Kubernetes, keys are Secrets in the team's namespace instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if errs := validation.IsDNS1123Label(team); len(errs) > 0 {
				return fmt.Errorf("--team %q: a team is a namespace name: %v", team, errs)
			}
			if file == "" {
				return errors.New("--api-keys-file is required")
			}
			key, err := auth.NewKey()
			if err != nil {
				return err
			}
			f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(f, "%s %s\n", team, key); err != nil {
				_ = f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), key)
			return err
		},
	}
	create.Flags().StringVar(&team, "team", "", "The team (a namespace name) the key belongs to.")
	create.Flags().StringVar(&file, "api-keys-file", "", "The keys file to append the key to.")
	cmd.AddCommand(create)
	return cmd
}
