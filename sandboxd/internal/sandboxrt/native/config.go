package native

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/cgroups"
	devconfig "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer/configs"
	lcseccomp "github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// config is the libcontainer configuration of a sandbox whose user
// namespace (newUserns) is at usernsPath.
func (r *Runtime) config(spec *sandboxrt.Spec, base uint32, envd, usernsPath string) (*configs.Config, error) {
	sc, err := defaultSeccomp()
	if err != nil {
		return nil, err
	}
	ids := []configs.IDMap{{ContainerID: 0, HostID: int64(base), Size: idRange}}
	var rules []*devconfig.Rule
	for _, d := range specconv.AllowedDevices {
		rules = append(rules, &d.Rule)
	}
	pids := r.opts.PidsLimit
	res := &cgroups.Resources{
		Memory:    spec.MemoryMiB << 20,
		PidsLimit: &pids,
		Devices:   rules,
	}
	res.MemorySwap = r.memorySwap(res.Memory)
	res.CpuQuota, res.CpuPeriod = cpuQuota(spec.CPUMilli)
	const nodev = unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV
	// When the host runs out of memory, sandboxes go before sandboxd.
	oomScoreAdj := 500
	caps := &configs.Capabilities{Bounding: sandboxrt.DefaultCapabilities, Effective: sandboxrt.DefaultCapabilities, Permitted: sandboxrt.DefaultCapabilities}
	mounts := []*configs.Mount{
		{Source: "proc", Destination: "/proc", Device: "proc", Flags: nodev},
		{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=65536k"},
		{Source: "devpts", Destination: "/dev/pts", Device: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: nodev, Data: "mode=1777,size=65536k"},
		{Source: "mqueue", Destination: "/dev/mqueue", Device: "mqueue", Flags: nodev},
		{Source: envd, Destination: sandboxrt.EnvdPath, Device: "bind", Flags: unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV},
	}
	// A volume's files keep the owners they have on the host as seen from
	// inside (uid 1000 on the host is the sandbox's 1000): idmapped
	// through the sandbox's user namespace.
	for _, v := range spec.Volumes {
		mounts = append(mounts, &configs.Mount{
			Source: v.Source, Destination: v.Path, Device: "bind", Flags: unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV,
			IDMapping: &configs.MountIDMapping{UserNSPath: usernsPath},
		})
	}
	var baseNS string
	if r.baseNS != nil {
		baseNS = nsFDPath(r.baseNS)
	}
	return &configs.Config{
		Rootfs:             filepath.Join(r.dir(spec.ID), "rootfs"),
		BaseMountNamespace: baseNS,
		RootPropagation:    unix.MS_SLAVE | unix.MS_REC,
		Hostname:           spec.Hostname,
		Namespaces: configs.Namespaces{
			// Joined, not made: see newUserns for why. The mappings
			// below are that namespace's, which libcontainer reads.
			{Type: configs.NEWUSER, Path: usernsPath},
			{Type: configs.NEWNS},
			{Type: configs.NEWPID},
			{Type: configs.NEWUTS},
			{Type: configs.NEWIPC},
			{Type: configs.NEWCGROUP},
			{Type: configs.NEWNET, Path: spec.NetNS},
		},
		UIDMappings:  ids,
		GIDMappings:  ids,
		Capabilities: caps,
		// Off, as in Docker: setuid programs of the template (sudo) work,
		// and make their caller root of the sandbox's user namespace only.
		NoNewPrivileges: false,
		Seccomp:         sc,
		OomScoreAdj:     &oomScoreAdj,
		Cgroups: &cgroups.Cgroup{
			Path:      filepath.Join(r.opts.CgroupParent, spec.ID),
			Resources: res,
		},
		Devices: specconv.AllowedDevices,
		Mounts:  mounts,
		MaskPaths: []string{
			"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
			"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		},
		ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
	}, nil
}

// cgroupPaths are the cgroup paths of sandbox id, as libcontainer.Create
// would find them (on cgroup v1 one per controller of sandboxControllers,
// each below sandboxd's own cgroup in that hierarchy), from its parent's
// found once: Create reads
// /proc/self/cgroup again for every controller of every sandbox (on this
// v1 host eleven times, a tenth of sandboxd's system calls of a
// lifecycle). Were sandboxd moved to another cgroup while it runs, its
// sandboxes would go on being made below the cgroups it started in.
func (r *Runtime) cgroupPaths(id string) (map[string]string, error) {
	parents, err := r.cgroupParents()
	if err != nil {
		return nil, err
	}
	paths := make(map[string]string, len(parents))
	for controller, parent := range parents {
		paths[controller] = filepath.Join(parent, id)
	}
	return paths, nil
}

// sandboxControllers are the cgroup v1 hierarchies in which each sandbox
// gets a cgroup of its own: those of the controllers sandboxd limits or
// reads it through (cpu and cpuacct: its vCPUs and usage; memory; pids;
// devices: the device rules; freezer: pause). In the others (cpuset, blkio,
// hugetlb, net_cls, net_prio, perf_event, rdma, misc, name=systemd, and the
// empty unified hierarchy of a hybrid host) its processes stay in
// sandboxd's cgroup, as they would inherit it: a cgroup there would limit
// and report nothing, and cost a directory made and removed in each for
// every sandbox (and cpuset's copy of its parent's CPUs and memory nodes),
// and the kernel's memory for it while the sandbox lives. On cgroup v2
// there is one hierarchy, and every sandbox has its cgroup in it.
var sandboxControllers = []string{"cpu", "cpuacct", "memory", "pids", "devices", "freezer"}

// findCgroupParents asks libcontainer's cgroup manager where a cgroup
// below the sandboxes' parent would be, and keeps the parent of each of
// sandboxControllers (on cgroup v2, of the one hierarchy). Nothing is made.
func (r *Runtime) findCgroupParents() (map[string]string, error) {
	const probe = "probe"
	m, err := manager.New(&cgroups.Cgroup{Path: filepath.Join(r.opts.CgroupParent, probe), Resources: &cgroups.Resources{}})
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	parents := map[string]string{}
	v2 := cgroups.IsCgroup2UnifiedMode()
	for controller, path := range m.GetPaths() {
		if !v2 && !slices.Contains(sandboxControllers, controller) {
			continue
		}
		if filepath.Base(path) != probe {
			return nil, fmt.Errorf("cgroups: libcontainer puts %s's cgroup at %s", controller, path)
		}
		parents[controller] = filepath.Dir(path)
	}
	if len(parents) == 0 {
		return nil, errors.New("cgroups: libcontainer finds no controller")
	}
	return parents, nil
}

// memorySwap is the limit on a sandbox's memory and swap together for a
// memory limit of memory: the same, so that it swaps nothing, where the
// kernel counts swap per cgroup (sandboxrt.NoSwap); else 0, none set.
func (r *Runtime) memorySwap(memory int64) int64 {
	if memory > 0 && r.noSwap() {
		return memory
	}
	return 0
}

// defaultSeccomp is Docker's default profile for the default capabilities,
// built once.
var defaultSeccomp = sync.OnceValues(seccompProfile)

func seccompProfile() (*configs.Seccomp, error) {
	lsc, err := seccomp.GetDefaultProfile(&specs.Spec{
		Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: sandboxrt.DefaultCapabilities}},
	})
	if err != nil {
		return nil, fmt.Errorf("default seccomp profile: %w", err)
	}
	sc, err := specconv.SetupSeccomp(lsc)
	if err != nil {
		return nil, fmt.Errorf("default seccomp profile: %w", err)
	}
	// Only the host's own system call ABI: the 32-bit ones (x86, x32 on an
	// amd64 host) are a kernel surface sandboxes rarely need, and each one
	// the filter covers costs the sandbox's start as much again (libseccomp
	// compiles the filter in every sandbox's init: ~35 ms for three ABIs
	// on the build machines, ~12 ms for one). A system call through another
	// ABI kills the calling thread.
	sc.Architectures = slices.DeleteFunc(sc.Architectures, func(a string) bool { return a != runtime.GOARCH })
	if len(sc.Architectures) == 0 {
		return nil, fmt.Errorf("default seccomp profile: no filter for %s", runtime.GOARCH)
	}
	// Compiled here once, not by libseccomp in every sandbox's init (our
	// fork of runc: hack/runc-fork/README.md), and only the program
	// travels to the init, not the rules for it to decode: about 5 ms of
	// CPU less a lifecycle at c = 20.
	if sc.Compiled, err = lcseccomp.Compile(sc); err != nil {
		return nil, fmt.Errorf("default seccomp profile: %w", err)
	}
	sc.Syscalls = nil
	return sc, nil
}
