package gvisor

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// upperTarAnnotation names a tar file runsc unpacks into the root overlay's
// upper layer when the sandbox starts (needs --allow-rootfs-tar-annotation).
const upperTarAnnotation = "dev.gvisor.tar.rootfs.upper"

// config is the OCI runtime configuration of a sandbox. The template is
// the root, writable as far as runsc knows: runsc then puts its overlay
// over it, and the gofer serves the template read-only.
func (r *Runtime) config(spec *sandboxrt.Spec, rootfs, envd, upperTar string) *specs.Spec {
	res := &specs.LinuxResources{}
	if spec.MemoryMiB > 0 {
		limit := spec.MemoryMiB << 20
		res.Memory = &specs.LinuxMemory{Limit: &limit}
		if r.noSwap() {
			// Memory and swap together: it swaps nothing.
			res.Memory.Swap = &limit
		}
	}
	if spec.CPUMilli > 0 {
		quota, period := spec.CPUMilli*sandboxrt.CPUPeriod/1000, uint64(sandboxrt.CPUPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if r.opts.PidsLimit > 0 {
		pids := r.opts.PidsLimit
		res.Pids = &specs.LinuxPids{Limit: &pids}
	}
	namespaces := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
	}
	if spec.NetNS != "" {
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.NetNS})
	}
	caps := slices.Clone(sandboxrt.DefaultCapabilities)
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: append([]string{sandboxrt.EnvdPath}, spec.EnvdArgs...),
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			// As under the native runtime: setuid programs (sudo) work.
			NoNewPrivileges: false,
		},
		Root:     &specs.Root{Path: rootfs},
		Hostname: spec.Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: sandboxrt.EnvdPath, Type: "bind", Source: envd, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			Namespaces:  namespaces,
			Resources:   res,
			CgroupsPath: filepath.Join(r.opts.CgroupParent, spec.ID),
		},
	}
	// A volume's files are written by the sandbox's own uids: runsc runs
	// as root on the host and keeps them.
	for _, v := range spec.Volumes {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: v.Path, Type: "bind", Source: v.Source, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	if upperTar != "" {
		s.Annotations = map[string]string{upperTarAnnotation: upperTar}
	}
	return s
}

// filesTar is a tar of files (by path inside the sandbox) for the root's
// upper layer: the files, owned by root, and the directories above them
// with the owner and mode they have in the template (0755 and root for
// those it lacks). A file replaces whatever the template has at its path,
// a symlink included.
func filesTar(rootfs string, files map[string][]byte) ([]byte, error) {
	dirs := map[string]bool{}
	byPath := map[string][]byte{} // by clean path, relative to the root
	for name, content := range files {
		clean := strings.TrimPrefix(path.Clean("/"+name), "/")
		if clean == "" {
			return nil, fmt.Errorf("file %q: not a file path", name)
		}
		if _, dup := byPath[clean]; dup {
			return nil, fmt.Errorf("file /%s given twice", clean)
		}
		byPath[clean] = content
		for d := path.Dir(clean); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// Parents before children (a prefix sorts first); the root is "./",
	// which runsc requires.
	for _, d := range append([]string{"."}, slices.Sorted(maps.Keys(dirs))...) {
		hdr, err := dirHeader(rootfs, d)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	for _, clean := range slices.Sorted(maps.Keys(byPath)) {
		content := byPath[clean]
		if dirs[clean] {
			return nil, fmt.Errorf("file /%s is also the directory of another", clean)
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: "./" + clean, Mode: 0o644,
			Size: int64(len(content)), ModTime: now, Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// dirHeader is the tar header of directory d (relative, "." for the root)
// of the upper layer, after the template's directory at d if it has one.
func dirHeader(rootfs, d string) (*tar.Header, error) {
	name := "./"
	if d != "." {
		name = "./" + d + "/"
	}
	hdr := &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: time.Now(), Format: tar.FormatPAX}
	var st unix.Stat_t
	err := unix.Lstat(filepath.Join(rootfs, d), &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		hdr.Mode = int64(st.Mode & 0o7777)
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		hdr.ModTime = time.Unix(st.Mtim.Unix())
	case err == nil && d == ".":
		return nil, fmt.Errorf("template root %s is not a directory", rootfs)
	case err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR):
		return nil, fmt.Errorf("template: %w", err)
	}
	return hdr, nil
}
