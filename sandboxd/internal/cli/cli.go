// Package cli is sandboxd's command line: `sandboxd serve` runs the daemon,
// `sandboxd template …` manages the templates sandboxes start from.
package cli

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// DefaultStateDir is where sandboxd keeps its records and templates.
const DefaultStateDir = "/var/lib/skiff/sandboxd"

// NewCommand returns the sandboxd command.
func NewCommand() *cobra.Command {
	var stateDir string
	root := &cobra.Command{
		Use:           "sandboxd",
		Short:         "The Skiff sandbox host daemon",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&stateDir, "state-dir", DefaultStateDir, "Directory of sandboxd's records and templates.")
	root.AddCommand(templateCommand(&stateDir), serveCommand(&stateDir))
	return root
}

func templateCommand(stateDir *string) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage the templates sandboxes start from"}
	library := func() (*template.Library, error) {
		return template.OpenLibrary(*stateDir + "/templates")
	}

	var archive, dir string
	importCmd := &cobra.Command{
		Use:   "import NAME (--oci-archive FILE | --dir DIR)",
		Short: "Import a template from an OCI image archive or a directory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (archive == "") == (dir == "") {
				return errors.New("set exactly one of --oci-archive and --dir")
			}
			lib, err := library()
			if err != nil {
				return err
			}
			var t *template.Template
			if archive != "" {
				t, err = lib.ImportArchive(args[0], archive)
			} else {
				t, err = lib.ImportDir(args[0], dir)
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "imported template %s version %s\n", t.Name, t.Version)
			return err
		},
	}
	importCmd.Flags().StringVar(&archive, "oci-archive", "", "An OCI image layout tarball, or a `docker save` tarball.")
	importCmd.Flags().StringVar(&dir, "dir", "", "A directory that is the root filesystem.")

	listCmd := &cobra.Command{
		Use:   "list",
		Short: "List the templates and their current versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lib, err := library()
			if err != nil {
				return err
			}
			ts, err := lib.List()
			if err != nil {
				return err
			}
			return printTemplates(cmd.OutOrStdout(), ts)
		},
	}
	cmd.AddCommand(importCmd, listCmd, buildCommand(library))
	return cmd
}

func buildCommand(library func() (*template.Library, error)) *cobra.Command {
	var opts template.BaseOptions
	cmd := &cobra.Command{
		Use:   "build base",
		Short: "Build the built-in template \"base\" (Debian with bash, python3, curl and git) with debootstrap",
		Long: `Build the built-in template "base", the one the e2b SDKs start by default:
Debian (debootstrap's minbase variant) with bash, coreutils, python3,
ca-certificates, curl, git and procps, and the user "user" (uid 1000, home
/home/user, shell /bin/bash, no sudo). Needs root and debootstrap.

The finished root filesystem and the downloaded packages are cached in
--cache-dir, so building again with the same options takes seconds and
yields the same version.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != template.BaseName {
				return fmt.Errorf("only the built-in template %q can be built; import others with `sandboxd template import`", template.BaseName)
			}
			lib, err := library()
			if err != nil {
				return err
			}
			opts.Progress = cmd.ErrOrStderr()
			t, err := lib.BuildBase(cmd.Context(), opts)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "built template %s version %s\n", t.Name, t.Version)
			return err
		},
	}
	cmd.Flags().StringVar(&opts.Suite, "suite", "bookworm", "The Debian release to build.")
	cmd.Flags().StringVar(&opts.Mirror, "mirror", "", "The Debian archive to build from (default: the host's apt mirror for the suite, else "+template.FallbackMirror+").")
	cmd.Flags().StringVar(&opts.CacheDir, "cache-dir", "", "Where downloaded packages and built root filesystems are kept (default: $XDG_CACHE_HOME/skiff/debootstrap, else ~/.cache/skiff/debootstrap).")
	return cmd
}

func printTemplates(w io.Writer, ts []*template.Template) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tIMPORTED\tROOTFS")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Version, t.Imported.UTC().Format("2006-01-02T15:04:05Z"), t.Rootfs)
	}
	return tw.Flush()
}
