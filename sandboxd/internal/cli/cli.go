// Package cli is sandboxd's command line: `sandboxd serve` runs the daemon,
// `sandboxd template …` manages the templates sandboxes start from, and
// `sandboxd cleanup` removes what a stopped sandboxd left for its next start.
package cli

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// NewCommand returns the sandboxd command.
func NewCommand() *cobra.Command {
	serve := NewOptions()
	root := &cobra.Command{
		Use:           "sandboxd",
		Short:         "The Skiff sandbox host daemon",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	serve.Global.AddFlags(root.PersistentFlags())
	root.AddCommand(templateCommand(serve.Global), serveCommand(serve), cleanupCommand(serve))
	return root
}

func templateCommand(global *GlobalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage the templates sandboxes start from"}
	library := func() (*template.Library, error) {
		return template.OpenLibrary(global.StateDir + "/templates")
	}

	var o ImportOptions
	importCmd := &cobra.Command{
		Use:   "import NAME (--oci-archive FILE | --dir DIR)",
		Short: "Import a template from an OCI image archive or a directory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			lib, err := library()
			if err != nil {
				return err
			}
			var t *template.Template
			if o.OCIArchive != "" {
				t, err = lib.ImportArchive(args[0], o.OCIArchive)
			} else {
				t, err = lib.ImportDir(args[0], o.Dir)
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "imported template %s version %s\n", t.Name, t.Version)
			return err
		},
	}
	o.AddFlags(importCmd.Flags())

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
	o := NewBuildOptions()
	cmd := &cobra.Command{
		Use:   "build base",
		Short: "Build the built-in template \"base\" (Debian with bash, python3, pip, curl, git and sudo) with debootstrap",
		Long: `Build the built-in template "base", the one the e2b SDKs start by default:
Debian (debootstrap's minbase variant) with bash, coreutils, python3 (also as
python), pip, ca-certificates, curl, git, procps and sudo, and the user "user"
(uid 1000, home /home/user, shell /bin/bash, passwordless sudo). Needs root and
debootstrap.

The finished root filesystem and the downloaded packages are cached in
--cache-dir, so building again with the same options takes seconds and
yields the same version.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			if args[0] != template.BaseName {
				return fmt.Errorf("only the built-in template %q can be built; import others with `sandboxd template import`", template.BaseName)
			}
			lib, err := library()
			if err != nil {
				return err
			}
			o.Progress = cmd.ErrOrStderr()
			t, err := lib.BuildBase(cmd.Context(), o.BaseOptions)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "built template %s version %s\n", t.Name, t.Version)
			return err
		},
	}
	o.AddFlags(cmd.Flags())
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
