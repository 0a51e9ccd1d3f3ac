package sandboxrt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultCapabilities are Docker's default capabilities, which a sandbox's
// root holds inside the sandbox (its user namespace, or gVisor's kernel)
// and never on the host: envd needs setuid and setgid to run commands as
// the sandbox's user.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// CPUPeriod is the CFS period of sandboxes' CPU quota, in µs.
const CPUPeriod = 100_000

// CgroupPaths are the directories of the cgroup rel, given relative to this
// process's cgroups as runtimes take it, in every hierarchy: below this
// process's cgroup on cgroup v1 (and in the v2 part of a hybrid host), and
// beside it — under its parent — on a cgroup v2 host, where libcontainer and
// runsc put relative cgroups.
func CgroupPaths(rel string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var paths []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		mount, own := "/sys/fs/cgroup/unified", parts[2]
		if parts[1] != "" {
			mount = "/sys/fs/cgroup/" + strings.TrimPrefix(parts[1], "name=")
		}
		if _, err := os.Stat(mount); err != nil {
			mount, own = "/sys/fs/cgroup", filepath.Dir(own)
		}
		paths = append(paths, filepath.Join(mount, own, rel))
	}
	return paths, nil
}

// RemoveCgroups removes the (empty) cgroup rel from every hierarchy; one
// that is not there is not an error.
func RemoveCgroups(rel string) error {
	paths, err := CgroupPaths(rel)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range paths {
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
