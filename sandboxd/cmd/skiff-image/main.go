// Command skiff-image builds the container image the Helm chart runs
// (charts/skiff: image.repository) as a docker-archive tarball, without a
// registry or a container daemon: Debian (debootstrap's minbase, cached as
// sandboxd's base template is) with what the binaries need at run time
// (libseccomp for sandboxd, debootstrap and wget for the base template's
// build, e2fsprogs for the sandboxes' disks, ca-certificates), no more, and
// sandbox-apiserver, sandbox-envd-proxy, sandboxd, sandboxd-init, envd, vk-sandbox (and
// runsc, when given) in /usr/local/bin. make image runs it, as root.
//
// Load the result with docker load, ctr images import, kind load
// image-archive, or push it with skopeo copy docker-archive:… or crane push.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/skiff-dev/skiff/sandboxd/internal/image"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
)

// binaries are the programs of bin/ the image holds.
var binaries = []string{"sandbox-apiserver", "sandbox-envd-proxy", "sandboxd", "sandboxd-init", "envd", "vk-sandbox"}

// packages are added to debootstrap's minbase: what the binaries need at
// run time, and no more (the sandboxes have their own root filesystems).
var packages = []string{"ca-certificates", "debootstrap", "wget", "e2fsprogs", "libseccomp2"}

func main() {
	bin := flag.String("bin", "bin", "Directory of the built binaries (make build)")
	runsc := flag.String("runsc", "", "gVisor's runsc to add (make runsc builds one); empty: none, and the image runs the native runtime only")
	out := flag.String("output", "bin/skiff-image.tar", "The docker-archive tarball to write")
	ref := flag.String("tag", "ghcr.io/skiff-dev/skiff:0.1.0", "The image's name and tag (repository:tag)")
	mirror := flag.String("mirror", "", "The Debian archive to build from; empty: the host's apt mirror, as sandboxd template build")
	suite := flag.String("suite", "bookworm", "The Debian release")
	cache := flag.String("cache-dir", "", "debootstrap's cache; empty: sandboxd's (~/.cache/skiff/debootstrap)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := build(ctx, *bin, *runsc, *out, *ref, *mirror, *suite, *cache)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-image:", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, bin, runsc, out, ref, mirror, suite, cache string) error {
	files := map[string]string{}
	for _, b := range binaries {
		files["/usr/local/bin/"+b] = filepath.Join(bin, b)
	}
	if runsc != "" {
		files["/usr/local/bin/runsc"] = runsc
	}
	for _, src := range files {
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("%w (make build, make runsc)", err)
		}
	}
	fmt.Fprintln(os.Stderr, "building the root filesystem (debootstrap: minutes the first time, cached after)")
	rootfs, err := template.BuildBase(ctx, template.BaseOptions{
		Suite: suite, Mirror: mirror, CacheDir: cache,
		Packages: packages,
		Progress: os.Stderr,
	})
	if err != nil {
		return err
	}
	for _, src := range files {
		if err := image.CheckLinked(rootfs.Dir, src); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".skiff-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	partial := filepath.Join(tmp, "image.tar")
	f, err := os.Create(partial)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(os.Stderr, "writing %s from %s\n", ref, rootfs.Dir)
	err = image.Write(f, ref, image.Config{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		WorkingDir: "/",
		Labels:     map[string]string{"org.opencontainers.image.source": "https://github.com/skiff-dev/skiff"},
	}, tmp,
		image.Layer{Comment: "Debian " + suite + " (minbase) with " + fmt.Sprint(packages), Dir: rootfs.Dir},
		image.Layer{Comment: "skiff's binaries", Files: files})
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// Renamed into place only when complete.
	if err := os.Rename(partial, out); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%d MiB): docker load -i %s, or kind load image-archive %s\n", out, st.Size()>>20, out, out)
	return nil
}
