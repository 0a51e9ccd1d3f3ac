package libcontainer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/opencontainers/runc/internal/pathrs"
	"github.com/opencontainers/runc/libcontainer/capabilities"
	"github.com/opencontainers/runc/libcontainer/configs"
)

// CInit, when set, has the init of every container whose configuration the
// init written in C can do (nsenter/skiff_init.c) done by it, in the init's
// stage 2, so that the Go runtime never starts in it; others keep the Go
// init. (Skiff)
var CInit bool

// SkiffInitPlanAttr is the bootstrap data's attribute holding the C init's
// plan (SKIFF_INIT_PLAN_ATTR in nsenter/skiff_init.h).
const SkiffInitPlanAttr uint16 = 27300

// SkiffRootfsTreeAttr is the bootstrap data's attribute holding the path
// of the root that the init's stage 1 clones (open_tree) before it joins a
// base mount namespace, and the C init attaches in the container's
// (SKIFF_ROOTFS_TREE_ATTR in nsenter/skiff_init.h).
const SkiffRootfsTreeAttr uint16 = 27301

// The plan's entries (the enum in nsenter/skiff_init.c).
const (
	planRootfs uint32 = iota + 1
	planPropagation
	planMount
	planDevice
	planMask
	planReadonly
	planHostname
	planCaps
	planUser
	planGroup
	planSeccomp
	planArg
	planEnv
	planCwd
	planKeyring
	planNoNewPrivs
	planPassedFiles
)

// cInitMaxItems is the most mounts, devices, paths, groups, arguments or
// variables of each kind the C init takes (MAX_ITEMS in skiff_init.c).
const cInitMaxItems = 256

// errNoCInit says why a configuration is left to the Go init.
type errNoCInit string

func (e errNoCInit) Error() string { return "not for the C init: " + string(e) }

// The mount flags the C init knows (as attributes of the new mount API).
const cInitMountFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
	unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_STRICTATIME | unix.MS_BIND | unix.MS_REC

// cInitPlan is the C init's plan for cfg, or an errNoCInit when some of
// cfg is only done by the Go init.
func cInitPlan(cfg *initConfig) ([]byte, error) {
	c := cfg.Config
	switch {
	case !c.Namespaces.Contains(configs.NEWNS) || !c.Namespaces.Contains(configs.NEWUSER):
		return nil, errNoCInit("no mount or user namespace")
	case c.NoPivotRoot, c.Readonlyfs, c.RootlessEUID, c.RootlessCgroups:
		return nil, errNoCInit("no pivot_root, read-only root, or rootless")
	case c.Umask != nil && *c.Umask != 0o022:
		return nil, errNoCInit("umask")
	case c.RootPropagation != 0 && c.RootPropagation != unix.MS_SLAVE|unix.MS_REC && c.RootPropagation != unix.MS_PRIVATE|unix.MS_REC:
		return nil, errNoCInit("root propagation")
	case c.MountLabel != "" || cfg.ProcessLabel != "" || cfg.AppArmorProfile != "":
		return nil, errNoCInit("labels")
	case c.Domainname != "" || len(c.Sysctl) > 0 || len(c.Networks) > 0 || len(c.Routes) > 0 || len(cfg.Networks) > 0:
		return nil, errNoCInit("domain name, sysctls or networks")
	case c.Personality != nil || c.MemoryPolicy != nil || cfg.Scheduler != nil || cfg.IOPriority != nil || cfg.CPUAffinity != nil:
		return nil, errNoCInit("personality, memory policy, scheduler, I/O priority or CPU affinity")
	case c.HasHook(configs.CreateContainer, configs.StartContainer):
		return nil, errNoCInit("hooks in the container")
	case cfg.CreateConsole || cfg.Capabilities == nil:
		return nil, errNoCInit("console, or no capabilities")
	case len(cfg.Args) == 0 || !filepath.IsAbs(cfg.Args[0]):
		return nil, errNoCInit("a command not named by its absolute path")
	case !filepath.IsAbs(c.Rootfs):
		return nil, errNoCInit("a root not named by its absolute path")
	case cfg.UID < 0 || cfg.UID >= math.MaxUint32 || cfg.GID < 0 || cfg.GID >= math.MaxUint32:
		return nil, errNoCInit("a user or group out of range")
	case len(c.Mounts) == 0 || c.Mounts[0].Device != "proc":
		// The C init mounts nothing under the root's /proc but proc, and
		// reads the container's procfs after pivot_root: proc first.
		return nil, errNoCInit("proc not the first mount")
	}
	for _, n := range []int{len(c.Mounts), len(c.Devices), len(c.MaskPaths), len(c.ReadonlyPaths), len(cfg.AdditionalGroups), len(cfg.Args), len(cfg.Env)} {
		if n > cInitMaxItems {
			return nil, errNoCInit(fmt.Sprintf("more than %d of a kind", cInitMaxItems))
		}
	}
	var b planBuf
	b.str(planRootfs, c.Rootfs)
	b.u64(planPropagation, uint64(c.RootPropagation))
	for _, m := range c.Mounts {
		if err := b.mount(m); err != nil {
			return nil, err
		}
	}
	for _, d := range c.Devices {
		p := pathrs.LexicallyCleanPath(d.Path)
		if d.Path == "" || p == "/dev/ptmx" {
			continue
		}
		if filepath.Dir(p) != "/dev" {
			return nil, errNoCInit("a device elsewhere than right in /dev")
		}
		b.str(planDevice, p)
	}
	masked := make(map[string]bool, len(c.MaskPaths))
	for _, p := range c.MaskPaths {
		if p = pathrs.LexicallyCleanPath(p); !masked[p] {
			masked[p] = true
			b.str(planMask, p)
		}
	}
	for _, p := range c.ReadonlyPaths {
		b.str(planReadonly, p)
	}
	if c.Hostname != "" {
		b.str(planHostname, c.Hostname)
	}
	masks, err := capabilities.Masks(cfg.Capabilities)
	if err != nil {
		return nil, err
	}
	var caps []byte
	for _, m := range masks {
		caps = binary.NativeEndian.AppendUint64(caps, m)
	}
	b.entry(planCaps, caps)
	b.entry(planUser, binary.NativeEndian.AppendUint32(binary.NativeEndian.AppendUint32(nil, uint32(cfg.UID)), uint32(cfg.GID)))
	for _, g := range cfg.AdditionalGroups {
		b.entry(planGroup, binary.NativeEndian.AppendUint32(nil, uint32(g)))
	}
	if s := c.Seccomp; s != nil {
		if s.Compiled == nil || s.ListenerPath != "" || s.Compiled.Flags&(1<<3) != 0 { // SECCOMP_FILTER_FLAG_NEW_LISTENER
			return nil, errNoCInit("a seccomp filter not compiled, or with a listener")
		}
		v := binary.NativeEndian.AppendUint32(nil, uint32(s.Compiled.Flags))
		nnp := uint32(0)
		if s.Compiled.NoNewPrivs {
			nnp = 1
		}
		v = binary.NativeEndian.AppendUint32(v, nnp)
		b.entry(planSeccomp, append(v, s.Compiled.Program...))
	}
	for _, a := range cfg.Args {
		b.str(planArg, a)
	}
	env, err := cInitEnv(cfg.Env)
	if err != nil {
		return nil, err
	}
	for _, e := range env {
		b.str(planEnv, e)
	}
	if cfg.Cwd != "" {
		b.str(planCwd, cfg.Cwd)
	}
	if !c.NoNewKeyring {
		// getSessionRingParams, with a user namespace.
		b.entry(planKeyring, append(binary.NativeEndian.AppendUint32(nil, 0x8), "_ses."+cfg.ContainerID+"\x00"...))
	}
	if cfg.NoNewPrivileges {
		b.entry(planNoNewPrivs, binary.NativeEndian.AppendUint32(nil, 1))
	}
	b.entry(planPassedFiles, binary.NativeEndian.AppendUint32(nil, uint32(cfg.PassedFilesCount)))
	if b.err != nil {
		return nil, b.err
	}
	// The plan travels in one netlink attribute.
	if len(b.buf) > math.MaxUint16-unix.NLA_HDRLEN-1 {
		return nil, errNoCInit(fmt.Sprintf("a plan of %d bytes", len(b.buf)))
	}
	return b.buf, nil
}

// cInitEnv is prepareEnv's environment where it needs nothing from the
// container's root: the last of each name, in order, HOME set.
func cInitEnv(env []string) ([]string, error) {
	seen := make(map[string]bool, len(env))
	out := make([]string, 0, len(env))
	home := false
	for i := len(env) - 1; i >= 0; i-- {
		kv := env[i]
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return nil, errors.New("invalid environment variable: missing '='")
		case k == "":
			return nil, errors.New("invalid environment variable: name cannot be empty")
		case strings.IndexByte(kv, 0) >= 0:
			return nil, fmt.Errorf("invalid environment variable %q: contains nul byte (\\x00)", k)
		case seen[k]:
			continue
		}
		seen[k] = true
		if k == "HOME" {
			if v == "" { // as unset: the Go init looks it up
				continue
			}
			home = true
		}
		out = append(out, kv)
	}
	if !home {
		return nil, errNoCInit("HOME not set (the Go init reads it from the root's passwd)")
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

type planBuf struct {
	buf  []byte
	err  error
	proc bool // proc is mounted
}

func (b *planBuf) entry(t uint32, v []byte) {
	b.buf = binary.NativeEndian.AppendUint32(b.buf, t)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, uint32(len(v)))
	b.buf = append(b.buf, v...)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

// str adds s as a C string.
func (b *planBuf) str(t uint32, s string) {
	if strings.IndexByte(s, 0) >= 0 {
		b.err = fmt.Errorf("C init plan: a NUL in %q", s)
		return
	}
	b.entry(t, append([]byte(s), 0))
}

func (b *planBuf) u64(t uint32, v uint64) {
	b.entry(t, binary.NativeEndian.AppendUint64(nil, v))
}

// mount adds m, when the C init mounts it as the Go init would.
func (b *planBuf) mount(m *configs.Mount) error {
	dst := pathrs.LexicallyCleanPath(m.Destination)
	switch {
	case m.Flags&^cInitMountFlags != 0 || m.ClearedFlags != 0 || len(m.PropagationFlags) > 0 ||
		m.RecAttr != nil || m.Extensions != 0 || m.IsIDMapped() || m.Relabel != "":
		return errNoCInit("mount " + dst + ": flags, propagation, attributes, extensions or an ID mapping")
	case !filepath.IsAbs(m.Destination) || dst == "/":
		return errNoCInit("mount " + dst + ": destination")
	}
	bind := uint32(0)
	switch m.Device {
	case "bind":
		switch {
		case dst == "/dev":
			return errNoCInit("/dev bound from the host")
		case !filepath.IsAbs(m.Source):
			return errNoCInit("mount " + dst + ": source not an absolute path")
		case m.Flags&^(unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC) != 0:
			// mount_setattr takes no atime flag alone, and the Go init
			// makes only the top of a recursive bind read-only.
			return errNoCInit("mount " + dst + ": a recursive bind, or atime flags on a bind")
		}
		bind = 1
	case "proc":
		if dst != "/proc" || b.proc {
			return errNoCInit("proc mounted elsewhere than /proc, or twice")
		}
		b.proc = true
	case "tmpfs":
		// The Go init makes a tmpfs read-only only after it is set up,
		// and gives one without a mode the mode of the directory it
		// covers.
		if m.Flags&unix.MS_RDONLY != 0 {
			return errNoCInit("a read-only tmpfs")
		}
		if !slices.ContainsFunc(strings.Split(m.Data, ","), func(o string) bool { return strings.HasPrefix(o, "mode=") }) {
			return errNoCInit("a tmpfs without a mode")
		}
	case "devpts", "mqueue":
	default:
		return errNoCInit("mount of a " + m.Device)
	}
	if m.Flags&unix.MS_BIND != 0 && bind == 0 || m.Flags&unix.MS_REC != 0 && bind == 0 {
		return errNoCInit("mount " + dst + ": bind flags on a filesystem")
	}
	if dst == "/dev" && m.Flags&unix.MS_RDONLY != 0 {
		return errNoCInit("a read-only /dev")
	}
	v := binary.NativeEndian.AppendUint64(nil, uint64(m.Flags))
	v = binary.NativeEndian.AppendUint32(v, bind)
	for _, s := range []string{m.Source, dst, m.Device, m.Data} {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("C init plan: a NUL in mount %s", dst)
		}
		v = append(append(v, s...), 0)
	}
	b.entry(planMount, v)
	return nil
}

// InitInC reports whether the container's init, started by this process,
// was done in C. (Skiff)
func (c *Container) InitInC() bool {
	c.m.Lock()
	defer c.m.Unlock()
	p, ok := c.initProcess.(*initProcess)
	return ok && p.cInit
}
