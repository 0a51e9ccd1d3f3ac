package cli

import (
	"errors"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// ImportOptions are the flags of `sandboxd template import`.
type ImportOptions struct {
	// OCIArchive is an OCI image layout or `docker save` tarball; Dir a
	// root filesystem. Exactly one is set.
	OCIArchive string
	Dir        string
}

// AddFlags registers the flags, each defaulting to the field's value.
func (o *ImportOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.OCIArchive, "oci-archive", o.OCIArchive, "An OCI image layout tarball or a docker save tarball to unpack as the template's current version: "+
		"plain or gzip layers, whiteouts honoured, digests checked. This or --dir, not both.")
	fs.StringVar(&o.Dir, "dir", o.Dir, "A directory tree to copy as the template's current version (its root filesystem), keeping modes, owners, times and symlinks (hard links become copies). "+
		"This or --oci-archive, not both.")
}

// Validate reports options that cannot work, naming their flags.
func (o *ImportOptions) Validate() error {
	if (o.OCIArchive == "") == (o.Dir == "") {
		return errors.New("set exactly one of --oci-archive and --dir")
	}
	return nil
}

// BuildOptions are the flags of `sandboxd template build`: what
// template.BuildBase takes.
type BuildOptions struct {
	template.BaseOptions
}

// NewBuildOptions returns the defaults.
func NewBuildOptions() *BuildOptions {
	return &BuildOptions{BaseOptions: template.BaseOptions{Suite: "bookworm"}}
}

// AddFlags registers the flags, each defaulting to the field's value.
func (o *BuildOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Suite, "suite", o.Suite, "The Debian release to build, by name; not empty.")
	fs.StringVar(&o.Mirror, "mirror", o.Mirror, "The Debian archive to build from, an http, https or file URL. Empty: the host's apt mirror, the first archive of "+
		"/etc/apt/sources.list, then of /etc/apt/sources.list.d/*.list and *.sources (deb822), that serves the suite, else the first whose path names debian, else "+
		template.FallbackMirror+".")
	fs.StringVar(&o.CacheDir, "cache-dir", o.CacheDir, "Where downloaded packages (debs/) and finished root filesystems (rootfs-<key>/) are kept. "+
		"Empty: $XDG_CACHE_HOME/skiff/debootstrap, else ~/.cache/skiff/debootstrap.")
}

// Validate reports options that cannot work, naming their flags.
func (o *BuildOptions) Validate() error {
	if o.Suite == "" {
		return errors.New("--suite must not be empty")
	}
	return nil
}
