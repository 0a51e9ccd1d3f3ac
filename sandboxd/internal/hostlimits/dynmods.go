package hostlimits

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/shared/mountinfo"
)

// Moving a process into a cgroup (what every sandbox's start does, in each
// of its cgroup hierarchies) takes the kernel's cgroup threadgroup lock
// for writing, and by default such a write waits for an RCU grace period
// unless another came just before: 5.8 ms on an idle 2-core host, 10 to
// 17 ms for more than half the creates with 1,000 sandboxes running. With
// the cgroup2 option favordynmods a move took 0.2 ms (on Linux 6.18 it
// switches the kernel to a lock per process, for good: the kernel keeps it
// until reboot, "per threadgroup rwsem mechanism can't be disabled"). The
// price is a slightly slower path for forks and exits. It is one setting
// for the whole kernel, whichever hierarchy sandboxd uses, set through a
// cgroup2 mount (the unified one of a hybrid host too); Linux 6.0 or later
// has it.

// DynmodsOption is the cgroup2 option.
const DynmodsOption = "favordynmods"

// Dynmods says what FavorDynmods found or did.
type Dynmods struct {
	// Mountpoint is the cgroup2 mount it was set through ("": none).
	Mountpoint string
	// Already is true when the option was set before; Set when
	// FavorDynmods set it.
	Already, Set bool
	// Unsupported is true when the kernel does not have the option.
	Unsupported bool
}

// FavorDynmods sets favordynmods on the host's cgroup2 hierarchy, keeping
// its other options, unless it has it already. The hierarchy is
// reconfigured, not remounted: the mount's own flags (read-only, nosuid,
// …) are not touched. A host without a cgroup2 mount (cgroup v1 only), or
// whose kernel has no such option, is left as it is. Set is false, with no
// error, when the kernel took the request but did not apply it (sandboxd
// outside the host's cgroup namespace).
func FavorDynmods() (Dynmods, error) {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return Dynmods{}, err
	}
	m, ok := cgroup2Mount(string(info))
	if !ok {
		return Dynmods{}, nil
	}
	d := Dynmods{Mountpoint: m.point}
	if slices.Contains(m.superOpts, DynmodsOption) {
		d.Already = true
		return d, nil
	}
	if features, err := os.ReadFile("/sys/kernel/cgroup/features"); err == nil && !slices.Contains(strings.Fields(string(features)), DynmodsOption) {
		d.Unsupported = true
		return d, nil
	}
	if err := reconfigure(m.point, m.options()); err != nil {
		return d, fmt.Errorf("set %s on %s: %w", DynmodsOption, m.point, err)
	}
	if info, err = os.ReadFile("/proc/self/mountinfo"); err == nil {
		if now, ok := cgroup2Mount(string(info)); ok && now.point == m.point {
			d.Set = slices.Contains(now.superOpts, DynmodsOption)
		}
	}
	return d, nil
}

// reconfigure sets flags (cgroup2 options without values) on the
// filesystem mounted at point, as the only options it has.
func reconfigure(point string, flags []string) error {
	fd, err := unix.Fspick(unix.AT_FDCWD, point, unix.FSPICK_CLOEXEC|unix.FSPICK_NO_AUTOMOUNT)
	if err != nil {
		return fmt.Errorf("fspick: %w", err)
	}
	defer unix.Close(fd)
	for _, f := range flags {
		if err := unix.FsconfigSetFlag(fd, f); err != nil {
			return fmt.Errorf("option %s: %w", f, err)
		}
	}
	if err := unix.FsconfigReconfigure(fd); err != nil {
		return fmt.Errorf("reconfigure: %w", err)
	}
	return nil
}

// mountEntry is a line of mountinfo.
type mountEntry struct {
	point, source string
	superOpts     []string
}

// cgroup2Mount finds the first cgroup2 mount in mountinfo: every cgroup2
// mount of the host shows the one hierarchy and its options.
func cgroup2Mount(info string) (mountEntry, bool) {
	for line := range strings.Lines(info) {
		before, after, ok := strings.Cut(strings.TrimSpace(line), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(before), strings.Fields(after)
		if len(f) < 6 || len(g) < 3 || g[0] != "cgroup2" {
			continue
		}
		return mountEntry{point: mountinfo.Unescape(f[4]), source: g[1], superOpts: strings.Split(g[2], ",")}, true
	}
	return mountEntry{}, false
}

// options are the hierarchy's options to set: those it has and
// favordynmods. A reconfiguration of cgroup2 sets all of its options to
// what it is given; read-only or not, and a security module's labels, are
// not cgroup2's and stay as they are.
func (m mountEntry) options() []string {
	var opts []string
	for _, o := range m.superOpts {
		switch o {
		case "rw", "ro", "seclabel", "":
		default:
			opts = append(opts, o)
		}
	}
	return append(opts, DynmodsOption)
}
