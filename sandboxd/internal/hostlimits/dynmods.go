package hostlimits

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Moving a process into a cgroup (what every sandbox's start does, in each
// of its cgroup hierarchies) takes the kernel's cgroup threadgroup lock
// for writing, and by default each such write waits for an RCU grace
// period unless another came just before: 5.8 ms on an idle 2-core host,
// 10 to 17 ms with 1,000 sandboxes running, where more than half the
// creates paid it. The cgroup v2 mount option favordynmods keeps that lock
// ready for writers (0.2 ms), at the cost of a slightly slower path for
// forks and exits. It is one setting for the whole kernel, whichever
// hierarchy sandboxd uses, made through a cgroup2 mount (the unified one
// of a hybrid host too). Linux 6.0 or later.

// DynmodsOption is the cgroup2 mount option.
const DynmodsOption = "favordynmods"

// Dynmods says what FavorDynmods found or did.
type Dynmods struct {
	// Mountpoint is the cgroup2 mount it was set through ("": none).
	Mountpoint string
	// Already is true when the option was set before.
	Already bool
}

// FavorDynmods remounts the host's cgroup2 hierarchy with favordynmods,
// keeping its other options, unless it has it already. A host without a
// cgroup2 mount (cgroup v1 only) is left as it is (Mountpoint "").
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
	flags, data := m.remount()
	if err := unix.Mount(m.source, m.point, "cgroup2", flags, data); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return d, fmt.Errorf("remount %s with %s: %w (Linux 6.0 or later has it; or give --cgroup-favor-dynmods=false)", m.point, DynmodsOption, err)
		}
		return d, fmt.Errorf("remount %s with %s: %w (or give --cgroup-favor-dynmods=false)", m.point, DynmodsOption, err)
	}
	return d, nil
}

// mountEntry is a line of mountinfo.
type mountEntry struct {
	point, source        string
	mountOpts, superOpts []string
}

// cgroup2Mount finds the first cgroup2 mount in mountinfo.
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
		return mountEntry{point: unescapeMount(f[4]), source: g[1], mountOpts: strings.Split(f[5], ","), superOpts: strings.Split(g[2], ",")}, true
	}
	return mountEntry{}, false
}

// remount is the mount(2) flags and data that remount m with favordynmods
// and everything it has now: a remount sets the mount's flags (nosuid,
// nodev, …) and the hierarchy's options (nsdelegate, …) to what it is
// given, not only what changes.
func (m mountEntry) remount() (uintptr, string) {
	flags := uintptr(unix.MS_REMOUNT)
	for _, o := range m.mountOpts {
		switch o {
		case "ro":
			flags |= unix.MS_RDONLY
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "noatime":
			flags |= unix.MS_NOATIME
		case "nodiratime":
			flags |= unix.MS_NODIRATIME
		case "relatime":
			flags |= unix.MS_RELATIME
		case "strictatime":
			flags |= unix.MS_STRICTATIME
		}
	}
	var opts []string
	for _, o := range m.superOpts {
		if o != "rw" && o != "ro" && o != "" {
			opts = append(opts, o)
		}
	}
	return flags, strings.Join(append(opts, DynmodsOption), ",")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}
