package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
)

// keysRequestTimeout bounds keys create's call to the kube-apiserver.
const keysRequestTimeout = 30 * time.Second

// keysCreateOptions are the flags of `keys create`.
type keysCreateOptions struct {
	team       string
	file       string
	kubeconfig string
}

func (o *keysCreateOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.team, "team", o.team, "The team the key belongs to: a namespace name. Required.")
	f.StringVar(&o.file, "api-keys-file", o.file, "Append the key to this keys file (for serve --inventory static; created if missing) instead of creating a Secret in Kubernetes. Excludes --kubeconfig.")
	f.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "The kubeconfig file of the cluster to create the key's Secret in; empty: $KUBECONFIG, else the pod's service account, else ~/.kube/config. Excludes --api-keys-file.")
}

// Validate reports every option that cannot work, naming its flag.
func (o *keysCreateOptions) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(o.team); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--team %q: a team is a namespace name: %s", o.team, strings.Join(msgs, "; ")))
	}
	if o.file != "" && o.kubeconfig != "" {
		errs = append(errs, errors.New("--api-keys-file and --kubeconfig exclude each other: a key goes to a keys file or to Kubernetes"))
	}
	return errors.Join(errs...)
}

func keysCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage the API keys that e2b SDKs send as E2B_API_KEY"}
	o := &keysCreateOptions{}
	create := &cobra.Command{
		Use:   "create --team TEAM [--api-keys-file FILE | --kubeconfig FILE]",
		Short: "Create a key for a team and print it (the only time it is shown)",
		Long: `Create a key for a team and print it on stdout; it is never shown again.

By default the key goes to Kubernetes, for serve --inventory kube: a Secret
labelled skiff.dev/api-key in the team's namespace, holding only the key's
SHA-256 digest. The namespace must exist (a team is a namespace). The
cluster is --kubeconfig, else $KUBECONFIG, else the pod's service account,
else ~/.kube/config. The Secret's name goes to stderr; deleting the Secret
revokes the key.

With --api-keys-file the key is appended to that keys file (one "team key"
per line) instead, which serve --inventory static reloads on change;
deleting the line revokes the key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			if o.file != "" {
				return appendKey(cmd.OutOrStdout(), o.file, o.team)
			}
			return createKeySecret(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o.kubeconfig, o.team)
		},
	}
	o.addFlags(create.Flags())
	cmd.AddCommand(create)
	return cmd
}

// appendKey makes a key for team, appends it to the keys file and prints it.
func appendKey(out io.Writer, file, team string) error {
	key, err := auth.NewKey()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open keys file: %w", err)
	}
	if _, err := fmt.Fprintf(f, "%s %s\n", team, key); err != nil {
		_ = f.Close()
		return fmt.Errorf("write keys file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write keys file: %w", err)
	}
	_, err = fmt.Fprintln(out, key)
	return err
}

// createKeySecret makes a key for team as a Secret in the team's namespace
// and prints the key on out and the Secret's name on diag.
func createKeySecret(ctx context.Context, out, diag io.Writer, kubeconfig, team string) error {
	cfg, err := kubeclient.RESTConfig(kubeconfig, "sandbox-apiserver")
	if err != nil {
		return err
	}
	cfg.Timeout = keysRequestTimeout
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	key, secret, err := auth.CreateKeySecret(ctx, c, team)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(out, key); err != nil {
		return err
	}
	_, err = fmt.Fprintf(diag, "created Secret %s/%s (delete it to revoke the key)\n", secret.Namespace, secret.Name)
	return err
}
