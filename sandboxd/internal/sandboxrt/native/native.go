// Package native runs sandboxes in Linux namespaces through runc's
// libcontainer, in process: user, pid, mount, uts, ipc and cgroup namespaces
// of their own, the network namespace sandboxd prepared, cgroup limits for
// CPU, memory and pids under sandboxd's own cgroup, Docker's default seccomp
// profile, and Docker's default capabilities — which, inside a user
// namespace, are no capabilities on the host. As in Docker, no_new_privs is
// off, so setuid programs (the base template's sudo) work inside.
//
// Each sandbox's root is an overlay: the template's read-only tree, idmapped
// into the sandbox's uid range, under a private upper directory. Each
// sandbox gets its own range of 65536 host uids and gids (a slot), so files
// and processes of two sandboxes never share an owner. envd is bind-mounted
// read-only from the host and runs as the sandbox's init.
//
// libcontainer keeps each sandbox's state on disk, and the sandbox's
// processes are not killed when sandboxd dies, so a restarted sandboxd
// finds, pauses, resumes, measures and stops the sandboxes of the one before.
//
// libcontainer starts each sandbox by running a binary with the argument
// "init": sandboxd-init (Options.InitBinary), or else the binary that uses
// this package, whose import of nsinit turns such a run into the sandbox's
// init. That init sets the sandbox up in C, before Go's runtime would start
// (our runc fork's patch 0005), unless Options.GoInit is set or the sandbox
// has volumes, which only libcontainer's Go init mounts.
package native

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/exeseal"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/diskimage"
	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/selfexe"
	"github.com/skiff-dev/skiff/shared/cgroups"

	// The cgroup device controller (libcontainer refuses device rules
	// without it).
	_ "github.com/opencontainers/cgroups/devices"

	// A binary with this runtime is each of its sandboxes' init (nsinit).
	_ "github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native/nsinit"
)

// Name is the --runtime value of this runtime.
const Name = "native"

// Options configure the runtime.
type Options struct {
	// Dir holds the runtime's state: each sandbox's upper layer, disk and
	// mount point, and what it needs across a host's reboot.
	Dir string
	// RunDir holds what ends with the host's boot: libcontainer's state of
	// each sandbox (containers/<id>: its configuration, its init's pid and
	// start time, the fifo its start waits on), on a tmpfs such as /run, as
	// runc's and containerd's are. Empty: Dir. Libcontainer rewrites its
	// state several times in a sandbox's start, and on a filesystem
	// without a journal each new inode costs the more the more were
	// removed in the last half minute (ext4 skips recently freed ones);
	// after a reboot the tmpfs is empty, as no sandbox runs.
	RunDir string
	// UIDBase is the first host uid (and gid) given to sandboxes: slot i
	// maps the sandbox's 0..65535 to UIDBase + i*65536 onwards. The ranges
	// must not be used by anything else on the host.
	UIDBase uint32
	// Slots is the number of uid ranges, the most sandboxes at once.
	Slots int
	// CgroupParent is the cgroup, relative to sandboxd's own, under which
	// each sandbox gets its cgroup.
	CgroupParent string
	// PidsLimit caps the processes of one sandbox, its threads counted;
	// those envd starts may have all but envdPids of them.
	PidsLimit int64
	// SpareDisks is how many emptied disks of each size the runtime keeps
	// mounted for the next sandboxes (spare.go); 0 keeps none.
	SpareDisks int
	// InitBinary is the binary libcontainer runs as each sandbox's init,
	// sandboxd-init (cmd/sandboxd-init) of the same build; empty: this
	// process's own binary, which starts sandboxes more slowly.
	InitBinary string
	// GoInit has every sandbox set up by libcontainer's init in Go, not
	// by the init in C of the runc fork (third_party/runc, patch 0005),
	// which sets up every sandbox without volumes the same way without
	// starting Go's runtime. Like InitBinary it holds for the whole
	// process: the last runtime made sets it.
	GoInit bool
	// PrivateDirs are directories, beside Dir and RunDir, below which
	// sandboxd mounts things per sandbox or volume (the network
	// namespaces, the volumes): a sandbox's mount namespace is made from a
	// base one without their mounts (basens.go), so that a start costs the
	// same with thousands of sandboxes running as with none.
	PrivateDirs []string
	// Logger receives what goes wrong in the background.
	Logger *slog.Logger
}

// DefaultOptions are the defaults sandboxd uses.
func DefaultOptions(dir string) Options {
	return Options{
		Dir:          dir,
		UIDBase:      1_000_000_000,
		Slots:        4096,
		CgroupParent: "skiff",
		PidsLimit:    4096,
		SpareDisks:   32,
		Logger:       slog.Default(),
	}
}

// Runtime is the native runtime.
type Runtime struct {
	opts       Options
	containers string // libcontainer's root
	// legacy is where a sandboxd before RunDir kept libcontainer's state
	// (<Dir>/containers): its sandboxes are found there.
	legacy    string
	sandboxes string // <Dir>/sandboxes/<id>/{rootfs,disk.img,disk/{upper,work},meta.json}
	envd      sandboxrt.EnvdCopies
	golden    *diskimage.Golden // empty disk images, one per size (disk.go)
	cgroups   cgroupDirs        // where Stats reads (usage.go)
	// cgroupParents is, by controller, the directory of the sandboxes'
	// parent cgroup, as libcontainer finds it (config.go).
	cgroupParents func() (map[string]string, error)
	// noSwap says whether sandboxes are held to no swap (config.go).
	noSwap func() bool

	mu    sync.Mutex
	slots map[int]string // slot → sandbox ID
	// live holds the sandboxes this process created, until they stop:
	// libcontainer keeps each one's state in memory as well as on disk,
	// so they are not read back from disk (and their whole configuration
	// decoded) on every status, wait and kill. Those of a previous
	// sandboxd are loaded from disk.
	live map[string]*libcontainer.Container
	// reaped gets the wait status of the init of each sandbox this
	// process started, once it exits (exit.go).
	reaped map[string]chan *os.ProcessState

	// Spare disks (spare.go): directories in spareDir, by disk size.
	spareDir string
	spareSeq atomic.Uint64
	spareMu  sync.Mutex
	spares   map[int64][]string

	// baseNS holds the mount namespace each sandbox's is made from
	// (basens.go); nil: sandboxd's own (the Go init, or none could be made).
	baseNS *os.File
}

var (
	_ sandboxrt.Runtime     = (*Runtime)(nil)
	_ sandboxrt.Snapshotter = (*Runtime)(nil)
)

// meta is what the runtime remembers of a sandbox beyond libcontainer.
type meta struct {
	Slot      int   `json:"slot"`
	UIDBase   int64 `json:"uidBase"`
	DiskLimit int64 `json:"diskLimit"`
}

// New opens the runtime's directory, finding the slots of the sandboxes a
// previous sandboxd left.
func New(opts Options) (*Runtime, error) {
	if opts.Slots <= 0 {
		return nil, errors.New("native runtime: slots must be positive")
	}
	if uint64(opts.UIDBase)+uint64(opts.Slots)*idRange > 1<<32-1 {
		return nil, fmt.Errorf("native runtime: %d uid ranges from %d pass the largest uid", opts.Slots, opts.UIDBase)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Runtime{
		opts:       opts,
		containers: filepath.Join(cmp.Or(opts.RunDir, opts.Dir), "containers"),
		legacy:     filepath.Join(opts.Dir, "containers"),
		sandboxes:  filepath.Join(opts.Dir, "sandboxes"),
		slots:      map[int]string{},
		live:       map[string]*libcontainer.Container{},
		reaped:     map[string]chan *os.ProcessState{},
		envd:       sandboxrt.EnvdCopies{Dir: filepath.Join(opts.Dir, "bin"), Perm: 0o711},
		golden:     &diskimage.Golden{Dir: filepath.Join(opts.Dir, "disks"), Format: diskFormat},
		spareDir:   SparesDir(opts.Dir),
		spares:     map[int64][]string{},
	}
	r.cgroupParents = sync.OnceValues(r.findCgroupParents)
	r.noSwap = sync.OnceValue(func() bool { return sandboxrt.NoSwap(opts.CgroupParent, opts.Logger) })
	// A sandbox's root reaches its root filesystem and envd through these
	// directories before it pivots: they must be searchable, not readable.
	for _, d := range []string{opts.Dir, r.containers, r.sandboxes, r.spareDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("native runtime: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("native runtime: %w", err)
		}
	}
	for _, d := range []string{opts.Dir, r.containers} {
		if err := checkSearchable(d); err != nil {
			return nil, fmt.Errorf("native runtime: %w", err)
		}
	}
	if err := useInitBinary(opts.InitBinary); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	libcontainer.CInit = !opts.GoInit
	if libcontainer.CInit {
		if errs := cInitUnavailable(); errs != nil {
			libcontainer.CInit = false
			opts.Logger.Warn("sandboxes get libcontainer's Go init: the init in C needs system calls this host refuses (Linux 5.12 or later, and no seccomp profile around sandboxd refusing them)",
				"error", errors.Join(errs...))
		}
	}
	warnWithoutWorkloadCgroups(opts.Logger)
	// Spares a crash left were perhaps not emptied.
	if err := r.discardSpares(); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	ids, err := r.List(context.Background())
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if m, err := r.readMeta(id); err == nil {
			r.slots[m.Slot] = id
		}
	}
	if libcontainer.CInit {
		private := slices.DeleteFunc(append([]string{opts.Dir, opts.RunDir}, opts.PrivateDirs...), func(d string) bool { return d == "" })
		if r.baseNS, err = openBaseMountNS(private); err != nil {
			opts.Logger.Warn("sandboxes' mount namespaces are made from sandboxd's, whose mounts for every running sandbox each start then copies", "error", err)
		}
	}
	return r, nil
}

// checkSearchable fails unless every directory above dir lets others
// search it: sandboxes start as unprivileged users of the host.
func checkSearchable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (above %s) must be searchable by others (chmod o+x): sandboxes reach their root filesystem through it as unprivileged users", d, abs)
		}
		if d == "/" {
			return nil
		}
	}
}

// Close releases what the runtime holds for itself: its spare disks and
// its base mount namespace. Sandboxes keep running.
func (r *Runtime) Close() error {
	err := r.discardSpares()
	if r.baseNS != nil {
		err = errors.Join(err, r.baseNS.Close())
	}
	return err
}

// Options returns the options the runtime was made with.
func (r *Runtime) Options() Options { return r.opts }

// Name implements sandboxrt.Runtime.
func (r *Runtime) Name() string { return Name }

func (r *Runtime) dir(id string) string { return filepath.Join(r.sandboxes, id) }

func (r *Runtime) readMeta(id string) (*meta, error) {
	data, err := os.ReadFile(filepath.Join(r.dir(id), "meta.json"))
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("sandbox %s: runtime state: %w", id, err)
	}
	return &m, nil
}

func (r *Runtime) writeMeta(id string, m *meta) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dir(id), "meta.json"), data, 0o600); err != nil {
		return fmt.Errorf("sandbox %s: write runtime state: %w", id, err)
	}
	return nil
}

func (r *Runtime) takeSlot(id string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.opts.Slots {
		if _, used := r.slots[i]; !used {
			r.slots[i] = id
			return i, nil
		}
	}
	return 0, fmt.Errorf("all %d uid ranges are in use", r.opts.Slots)
}

func (r *Runtime) releaseSlot(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, owner := range r.slots {
		if owner == id {
			delete(r.slots, i)
		}
	}
}

var _ sandboxrt.Preparer = (*Runtime)(nil)

// Start implements sandboxrt.Runtime.
func (r *Runtime) Start(ctx context.Context, spec *sandboxrt.Spec) error {
	return r.start(ctx, spec, true)
}

// Prepare implements sandboxrt.Preparer: libcontainer's create (runc
// create), whose init waits on the container's exec fifo with everything
// set up, seccomp filter included.
func (r *Runtime) Prepare(ctx context.Context, spec *sandboxrt.Spec) error {
	return r.start(ctx, spec, false)
}

// StartPrepared implements sandboxrt.Preparer: libcontainer's start (runc
// start) after the cgroup takes the create's limits.
func (r *Runtime) StartPrepared(ctx context.Context, id string, lim sandboxrt.Limits) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := r.load(id)
	if err != nil {
		return err
	}
	st, err := c.Status()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if st != libcontainer.Created {
		return fmt.Errorf("sandbox %s: not a prepared sandbox (%s)", id, st)
	}
	cfg := c.Config()
	res := cfg.Cgroups.Resources
	quota, period := cpuQuota(lim.CPUMilli)
	memory := lim.MemoryMiB << 20
	swap := r.memorySwap(memory)
	if res.Memory != memory || res.MemorySwap != swap || res.CpuQuota != quota || res.CpuPeriod != period {
		res.Memory, res.MemorySwap, res.CpuQuota, res.CpuPeriod = memory, swap, quota, period
		if err := c.Set(cfg); err != nil {
			return fmt.Errorf("sandbox %s: set limits: %w", id, err)
		}
	}
	if m, err := r.readMeta(id); err != nil {
		return err
	} else if m.DiskLimit != diskLimit(lim.DiskMiB) {
		// The disk was made with the sandbox, at its size.
		return fmt.Errorf("sandbox %s: prepared with a disk of %d bytes, not %d MiB", id, m.DiskLimit, lim.DiskMiB)
	}
	if err := c.Exec(); err != nil {
		return fmt.Errorf("sandbox %s: start envd: %w", id, err)
	}
	return nil
}

// cpuQuota is the CFS quota and period of a CPU limit in millicores; 0 is
// no limit.
func cpuQuota(milli int64) (quota int64, period uint64) {
	if milli <= 0 {
		return 0, 0
	}
	return milli * sandboxrt.CPUPeriod / 1000, sandboxrt.CPUPeriod
}

func (r *Runtime) start(ctx context.Context, spec *sandboxrt.Spec, run bool) (err error) {
	if !seccompBuilt {
		return errors.New("native runtime: sandboxd was built without seccomp support (build with CGO_ENABLED=1 -tags seccomp and libseccomp-dev)")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	slot, err := r.takeSlot(spec.ID)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			if cerr := r.Stop(context.WithoutCancel(ctx), spec.ID); cerr != nil {
				r.opts.Logger.Error("cleaning up a sandbox that failed to start", "sandbox", spec.ID, "error", cerr)
			}
			r.releaseSlot(spec.ID)
		}
	}()
	base := r.opts.UIDBase + uint32(slot)*idRange
	m := &meta{Slot: slot, UIDBase: int64(base), DiskLimit: diskLimit(spec.DiskMiB)}
	// The sandbox's own user namespace, held open until its init has
	// joined it (c.Start); the idmapped template holds it too.
	userns, err := newUserns(base)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer userns.Close()
	if err := r.prepareRoot(spec, m, userns); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	envd, err := r.envd.Copy(spec.Envd)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	cfg, err := r.config(spec, base, envd, nsPath(userns))
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	log, err := r.openLog(spec)
	if err != nil {
		return fmt.Errorf("sandbox %s: open log: %w", spec.ID, err)
	}
	defer log.Close()
	paths, err := r.cgroupPaths(spec.ID)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	c, err := libcontainer.CreateWithCgroupPaths(r.containers, spec.ID, cfg, paths)
	if err != nil {
		return fmt.Errorf("sandbox %s: create container: %w", spec.ID, err)
	}
	r.mu.Lock()
	r.live[spec.ID] = c
	r.mu.Unlock()
	args := append([]string{sandboxrt.EnvdPath}, spec.EnvdArgs...)
	var extra []*os.File
	if spec.NetNS != "" && spec.EnvdPort > 0 {
		sock, err := listenIn(spec.NetNS, spec.EnvdPort)
		if err != nil {
			return fmt.Errorf("sandbox %s: envd's socket: %w", spec.ID, err)
		}
		defer sock.Close() // envd has its own copy
		extra = append(extra, sock)
		args = append(args, "--listen-fd", "3")
	}
	if work := r.workloadCgroup(spec.ID, paths); work != nil {
		defer work.Close() // envd has its own copy
		extra = append(extra, work)
		args = append(args, "--workload-cgroup-fd", strconv.Itoa(2+len(extra)))
	}
	p := &libcontainer.Process{
		Args:       args,
		ExtraFiles: extra,
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		Cwd:        "/",
		Stdout:     log,
		Stderr:     log,
		Init:       true,
	}
	if err := c.Start(p); err != nil {
		return fmt.Errorf("sandbox %s: create container: %w", spec.ID, err)
	}

	// Reap the init when it exits, while this sandboxd lives, keeping its
	// status for WaitExit; after a restart the host's init (or subreaper)
	// reaps it.
	reaped := make(chan *os.ProcessState, 1)
	r.mu.Lock()
	r.reaped[spec.ID] = reaped
	r.mu.Unlock()
	go func() {
		st, _ := p.Wait()
		reaped <- st
	}()
	pid, err := p.Pid()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	bootDir := r.dir(spec.ID)
	if spec.DiskMiB > 0 {
		bootDir = filepath.Join(bootDir, diskMount)
	}
	if err := mountBootID(bootDir, pid); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if !run {
		return nil
	}
	if err := c.Exec(); err != nil {
		return fmt.Errorf("sandbox %s: start envd: %w", spec.ID, err)
	}
	return nil
}

// openLog opens the file envd writes its log to. A sandbox with a disk of
// its own keeps it there, beside (not in) its writable layer, where the
// sandbox cannot see it, and spec.Log links to it: whatever envd writes
// then fills the sandbox's disk, never the host's, even if something in
// the sandbox got hold of envd's descriptor past envd's own budget.
func (r *Runtime) openLog(spec *sandboxrt.Spec) (*os.File, error) {
	path := spec.Log
	if spec.DiskMiB > 0 {
		path = filepath.Join(r.dir(spec.ID), diskMount, "envd.log")
		if err := os.Remove(spec.Log); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if err := os.Symlink(path, spec.Log); err != nil {
			return nil, err
		}
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
}

// prepareRoot builds the sandbox's root: its directory, the overlay of the
// template idmapped through userns and a private upper layer, and the
// extra files.
func (r *Runtime) prepareRoot(spec *sandboxrt.Spec, m *meta, userns *os.File) error {
	dir := r.dir(spec.ID)
	// The writable layer is on the sandbox's own filesystem (disk.go): a
	// spare one (spare.go), with the directory it is in, or a new one;
	// without a disk size, on the state directory's.
	spare := spec.DiskMiB > 0 && r.takeDisk(spec.ID, diskLimit(spec.DiskMiB))
	if !spare {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("create sandbox directory: %w", err)
		}
	}
	if err := r.writeMeta(spec.ID, m); err != nil {
		return err
	}
	layers := dir
	switch {
	case spare:
		layers = filepath.Join(dir, diskMount)
	case spec.DiskMiB > 0:
		var err error
		if layers, err = r.attachDisk(dir, spec.DiskMiB); err != nil {
			return err
		}
	}
	upper, work, rootfs := filepath.Join(layers, "upper"), filepath.Join(layers, "work"), filepath.Join(dir, "rootfs")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	// The sandbox's root directory is its root's: the upper layer's owner.
	uid := int(m.UIDBase)
	if err := os.Chown(upper, uid, uid); err != nil {
		return fmt.Errorf("chown upper layer: %w", err)
	}
	// The sandbox's root reaches its directory through the host: let it.
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	// Each snapshot layer above the template, topmost first, idmapped
	// like it.
	var lowers []string
	for _, tree := range append(slices.Clone(spec.Layers), spec.Rootfs) {
		lower, err := idmappedTree(tree, userns)
		if err != nil {
			return err
		}
		defer lower.Close()
		lowers = append(lowers, fmt.Sprintf("/proc/self/fd/%d", lower.Fd()))
	}
	if err := sandboxrt.MountOverlay(rootfs, lowers, upper, work); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	return writeFiles(rootfs, spec.Files, uid)
}

// writeFiles writes files into the sandbox's root, owned by its root.
func writeFiles(rootfs string, files map[string][]byte, uid int) error {
	if len(files) == 0 {
		return nil
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for name, content := range files {
		if err := writeFile(root, name, content, uid); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes one file under root.
func writeFile(root *os.Root, name string, content []byte, uid int) error {
	name = strings.TrimPrefix(filepath.Clean("/"+name), "/")
	if err := makeParents(root, name, uid); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	_ = root.Remove(name) // a symlink (resolv.conf often is) is replaced, not followed
	if err := root.WriteFile(name, content, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := root.Lchown(name, uid, uid); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	return nil
}

// makeParents makes the directories of name (relative to root) that the
// template lacks (/run/e2b), each the sandbox root's (uid), as gVisor's
// tar of the same files makes them. A symlink to an absolute path on the
// way, which root cannot follow, is replaced by a directory, as gVisor
// replaces it.
func makeParents(root *os.Root, name string, uid int) error {
	dir := filepath.Dir(name)
	if dir == "." {
		return nil
	}
	p := ""
	for part := range strings.SplitSeq(dir, "/") {
		p = filepath.Join(p, part)
		fi, err := root.Lstat(p)
		switch {
		case err == nil && fi.Mode()&fs.ModeSymlink != 0:
			target, err := root.Readlink(p)
			if err != nil || !filepath.IsAbs(target) {
				continue // followed within root
			}
			if err := root.Remove(p); err != nil {
				return err
			}
		case err == nil:
			continue
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := root.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := root.Lchown(p, uid, uid); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runtime) load(id string) (*libcontainer.Container, error) {
	r.mu.Lock()
	c := r.live[id]
	r.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := libcontainer.Load(r.containers, id)
	if errors.Is(err, libcontainer.ErrNotExist) && r.legacy != r.containers {
		c, err = libcontainer.Load(r.legacy, id)
	}
	if errors.Is(err, libcontainer.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: load container: %w", id, err)
	}
	return c, nil
}

// Status implements sandboxrt.Runtime.
func (r *Runtime) Status(_ context.Context, id string) (sandboxrt.Status, error) {
	c, err := r.load(id)
	if err != nil {
		if _, serr := os.Stat(r.dir(id)); serr == nil && errors.Is(err, sandboxrt.ErrNotFound) {
			return sandboxrt.Stopped, nil // a start that died half-way
		}
		return sandboxrt.Stopped, err
	}
	st, err := c.Status()
	if err != nil {
		return sandboxrt.Stopped, fmt.Errorf("sandbox %s: %w", id, err)
	}
	switch st {
	case libcontainer.Running, libcontainer.Created:
		return sandboxrt.Running, nil
	case libcontainer.Paused:
		return sandboxrt.Paused, nil
	default:
		return sandboxrt.Stopped, nil
	}
}

// Pause implements sandboxrt.Runtime: the cgroup freezer stops every
// process; memory stays.
func (r *Runtime) Pause(_ context.Context, id string) error {
	c, err := r.load(id)
	if err != nil {
		return err
	}
	if err := c.Pause(); err != nil {
		return fmt.Errorf("sandbox %s: pause: %w", id, err)
	}
	return nil
}

// Resume implements sandboxrt.Runtime.
func (r *Runtime) Resume(_ context.Context, id string) error {
	c, err := r.load(id)
	if err != nil {
		return err
	}
	if err := c.Resume(); err != nil {
		return fmt.Errorf("sandbox %s: resume: %w", id, err)
	}
	return nil
}

// CaptureLayer implements sandboxrt.Snapshotter: the sandbox's upper
// directory copied with its cgroup frozen (a paused sandbox stays frozen),
// owners moved back into the sandbox's own range.
func (r *Runtime) CaptureLayer(ctx context.Context, id, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m, err := r.readMeta(id)
	if err != nil {
		return err
	}
	c, err := r.load(id)
	if err != nil {
		return err
	}
	st, err := c.Status()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	switch st {
	case libcontainer.Running:
		if err := c.Pause(); err != nil {
			return fmt.Errorf("sandbox %s: freeze for the copy: %w", id, err)
		}
		defer func() {
			if err := c.Resume(); err != nil {
				r.opts.Logger.Error("thawing a sandbox after copying its layer", "sandbox", id, "error", err)
			}
		}()
	case libcontainer.Paused:
	default:
		return fmt.Errorf("sandbox %s: copy its layer: %s, not running", id, st)
	}
	layers := r.dir(id)
	if m.DiskLimit > 0 {
		layers = filepath.Join(layers, diskMount)
	}
	return layer.CopyUpper(filepath.Join(layers, "upper"), dir, m.UIDBase)
}

var _ sandboxrt.InPlacePauser = (*Runtime)(nil)

// PausesInPlace implements sandboxrt.InPlacePauser: Pause is the cgroup
// freezer.
func (*Runtime) PausesInPlace() {}

var _ sandboxrt.Salvager = (*Runtime)(nil)

// SalvageLayer implements sandboxrt.Salvager: the upper directory of a
// sandbox whose processes are gone stays in its directory (on its disk
// image, mounted for the copy when a reboot unmounted it).
func (r *Runtime) SalvageLayer(ctx context.Context, id, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m, err := r.readMeta(id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if c, err := r.load(id); err == nil {
		if st, err := c.Status(); err != nil || st != libcontainer.Stopped {
			return fmt.Errorf("sandbox %s: salvage its layer: it has processes (%v)", id, st)
		}
	}
	root := r.dir(id)
	if m.DiskLimit > 0 {
		mnt := filepath.Join(root, diskMount)
		if !sandboxrt.IsMountPoint(mnt) {
			if err := diskimage.MountKept(filepath.Join(root, diskImage), mnt, diskFormat.MountData); err != nil {
				return fmt.Errorf("sandbox %s: mount its disk: %w", id, err)
			}
			defer func() {
				if err := detachDisk(root); err != nil {
					r.opts.Logger.Warn("unmount a salvaged sandbox's disk", "sandbox", id, "error", err)
				}
			}()
		}
		root = mnt
	}
	return layer.CopyUpper(filepath.Join(root, "upper"), dir, m.UIDBase)
}

// Stats implements sandboxrt.Runtime.
func (r *Runtime) Stats(_ context.Context, id string) (sandboxrt.Stats, error) {
	u, err := r.cgroupUsage(id)
	if errors.Is(err, os.ErrNotExist) {
		return sandboxrt.Stats{}, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
	}
	if err != nil {
		return sandboxrt.Stats{}, fmt.Errorf("sandbox %s: stats: %w", id, err)
	}
	out := sandboxrt.Stats{Time: time.Now(), CPUUsage: u.cpu, MemoryUsed: u.used, MemoryLimit: u.limit}
	if m, err := r.readMeta(id); err == nil {
		out.DiskLimit = m.DiskLimit
	}
	out.DiskUsed = max(diskUsed(r.dir(id)), 0)
	return out, nil
}

// diskLimit is the size, in bytes, of the disk a sandbox of mib MiB gets;
// 0 (no disk of its own) for 0.
func diskLimit(mib int64) int64 {
	if mib <= 0 {
		return 0
	}
	return max(mib, diskimage.MinMiB) << 20
}

// Stop implements sandboxrt.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	// The sandbox is read (from memory, if this process started it)
	// before it leaves live: a load after that reads the disk.
	c, err := r.load(id)
	r.mu.Lock()
	reaped := r.reaped[id]
	delete(r.live, id)
	delete(r.reaped, id)
	r.mu.Unlock()
	var errs []error
	switch {
	case errors.Is(err, sandboxrt.ErrNotFound):
		// A start cut short (sandboxd killed during it) may have made
		// the sandbox's cgroup before libcontainer recorded anything.
		if err := cgroups.Remove(filepath.Join(r.opts.CgroupParent, id)); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
		}
	case err != nil:
		errs = append(errs, err)
	default:
		if err := kill(ctx, c, reaped); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
		} else if err := c.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: destroy container: %w", id, err))
		}
	}
	rootfs := filepath.Join(r.dir(id), "rootfs")
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("sandbox %s: unmount root: %w", id, err))
	}
	if len(errs) == 0 && r.keepDisk(id) {
		r.releaseSlot(id)
		return nil
	}
	if err := detachDisk(r.dir(id)); err != nil {
		errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(r.dir(id)); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: remove layers: %w", id, err))
		}
		r.releaseSlot(id)
	}
	return errors.Join(errs...)
}

// kill stops every process of the sandbox: SIGKILL to its init ends its pid
// namespace. A frozen sandbox has every process sent SIGKILL while frozen,
// then is thawed: none runs again (a sandbox paused to its files would lose
// what it wrote), where a thaw first would let them run. reaped,
// if this process started the sandbox, gets the init's status when it has
// been reaped: the kernel reaps an init only after every other process of
// its pid namespace has exited, so that is the whole sandbox's end, with
// no polling of the container's state (about 0.5 ms of CPU a kill at c =
// 20, five or six reads of it on the backoff below). The status goes back
// into reaped for exitOf.
func kill(ctx context.Context, c *libcontainer.Container, reaped chan *os.ProcessState) error {
	st, err := c.Status()
	if err != nil {
		return err
	}
	if st == libcontainer.Stopped {
		return nil
	}
	if st == libcontainer.Paused {
		// Every process but the init first: one killed while frozen (on
		// cgroup v2 it dies at once) stays a zombie of its frozen parent,
		// and the init holds the pid namespace until it goes, last, so
		// no pid of the list is another process's by then.
		init := -1
		if state, err := c.State(); err == nil {
			init = state.InitProcessPid
		}
		if pids, err := c.Processes(); err == nil {
			for _, pid := range pids {
				if pid != init {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if init > 0 {
			_ = unix.Kill(init, unix.SIGKILL)
		}
		// As libcontainer's own thaw after a SIGKILL, a failure here is
		// not the kill's: the wait below says whether the sandbox died.
		_ = c.Resume()
	}
	if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		return fmt.Errorf("kill: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if reaped != nil {
		select {
		case ps := <-reaped:
			reaped <- ps
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for the sandbox to die: %w", ctx.Err())
		}
	}
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		st, err := c.Status()
		if err != nil {
			return err
		}
		if st == libcontainer.Stopped {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the sandbox to die: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
}

// List implements sandboxrt.Runtime.
func (r *Runtime) List(_ context.Context) ([]string, error) {
	var ids []string
	dirs := []string{r.sandboxes, r.containers}
	if r.legacy != r.containers {
		dirs = append(dirs, r.legacy)
	}
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) && d == r.legacy {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("native runtime: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() && !slices.Contains(ids, e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// ReexecSealed makes this process run from a sealed in-memory copy of its
// binary, re-executing it once. libcontainer starts every sandbox by running
// /proc/self/exe, and unless that is such a copy it makes one — a copy of
// the whole binary — for each sandbox, so a sandbox can never overwrite the
// host's binary. Sealing once at start-up keeps that protection and takes
// the copy off every create. When the copy cannot be sealed it returns nil
// and libcontainer copies per start as before.
func ReexecSealed() error {
	// The run ReexecSealed started keeps selfexe.Env: the binary's path
	// on disk, which os.Executable no longer gives.
	if os.Getenv(selfexe.Env) != "" || exeseal.IsSelfExeCloned() {
		return nil
	}
	onDisk, err := os.Executable()
	if err != nil {
		return err
	}
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer self.Close()
	st, err := self.Stat()
	if err != nil {
		return err
	}
	clone, err := exeseal.CloneBinary(self, st.Size(), "/proc/self/exe", os.TempDir())
	if err != nil {
		return fmt.Errorf("seal a copy of this binary: %w", err)
	}
	if !exeseal.IsCloned(clone) {
		return clone.Close()
	}
	if err := os.Setenv(selfexe.Env, onDisk); err != nil {
		return err
	}
	return syscall.Exec("/proc/self/fd/"+strconv.Itoa(int(clone.Fd())), os.Args, os.Environ())
}

// listenIn returns a TCP socket listening on port of every address of the
// network namespace at netnsPath, for envd to serve on (--listen-fd). A
// connection to it is accepted by the kernel at once and waits until envd
// serves, so sandboxd learns that envd is up from its first request rather
// than by polling; and a prepared sandbox's socket listens before envd
// even starts.
func listenIn(netnsPath string, port int) (*os.File, error) {
	target, err := os.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	// On a throwaway thread: one left in the sandbox's namespace ends
	// instead of running other goroutines.
	fd, err := onThrowawayThread(func() (int, error) {
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			return -1, fmt.Errorf("enter network namespace: %w", err)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Port: port})
		}
		if err == nil {
			err = unix.Listen(fd, unix.SOMAXCONN)
		}
		if err != nil {
			_ = unix.Close(fd)
			return -1, err
		}
		return fd, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listen on port %d: %w", port, err)
	}
	return os.NewFile(uintptr(fd), "envd-listener"), nil
}
