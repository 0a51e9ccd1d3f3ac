// Package gvisor runs sandboxes under gVisor's runsc: a user-space kernel
// (the sentry, on the systrap platform) between the workload and the host,
// with gVisor's own network stack on the interfaces of the network
// namespace sandboxd prepared. The runtime drives the runsc command through
// an OCI bundle per sandbox; runsc is built from the Go module proxy
// (hack/runsc/build.sh).
//
// The sandbox's root is the template, read through runsc's gofer, under a
// gVisor overlay whose upper layer lives in a file under the sandbox's
// directory (--overlay2=root:dir=…): writes never reach the template. The
// sandbox's extra files (resolv.conf, hosts) are put into that upper layer
// from a tar file when it starts, so they are ordinary files of its root.
//
// Pause checkpoints the sandbox to disk, memory included (runsc
// checkpoint), and ends its processes, so a paused sandbox holds no memory;
// Resume restores it (runsc restore). A paused sandbox is only files on
// disk, so it survives anything sandboxd does, restarts included.
//
// runsc keeps its own state under Dir/runsc-root and the sandbox processes
// it starts are in a session of their own, not children of sandboxd: a
// restarted sandboxd (a new Runtime on the same Dir) finds, pauses,
// resumes, measures and stops the sandboxes of the one before.
//
// What differs from the native runtime:
//   - Memory: runsc puts the sentry, the gofer and the workload's memory in
//     one host memory cgroup, with the sandbox's limit. gVisor has no OOM
//     killer of its own (google/gvisor#1967, #2520), so a sandbox that
//     exceeds its limit is killed whole by the host's cgroup OOM killer and
//     its status becomes Stopped, where the native runtime kills only the
//     hog.
//   - Network: runsc takes the addresses and routes of the namespace's
//     interfaces into its own stack when the sandbox starts (and removes
//     them from the namespace), so routes changed in the namespace later do
//     not reach a running sandbox. The runtime records them at Start and
//     puts them back before each restore, which reads them again.
package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/shared/cgroups"
)

// Name is the --runtime value of this runtime.
const Name = "gvisor"

// Options configure the runtime.
type Options struct {
	// Dir holds the runtime's state: runsc's root (Dir/runsc-root) and each
	// sandbox's bundle, upper layer and checkpoint (Dir/sandboxes/<id>).
	// It must be an absolute path without ',' or ':' (runsc's --overlay2
	// flag cannot carry them).
	Dir string
	// Runsc is the path of a static runsc binary.
	Runsc string
	// Platform is runsc's --platform: "systrap" (the default) or "ptrace".
	// "kvm" does not work where KVM is PVM.
	Platform string
	// CgroupParent is the cgroup, relative to sandboxd's own, under which
	// each sandbox gets its cgroup.
	CgroupParent string
	// PidsLimit caps the host tasks (sentry and gofer threads, systrap stub
	// processes) of one sandbox.
	PidsLimit int64
	// RunscFlags are more global flags for runsc, after the runtime's own,
	// for example "--debug", "--debug-log=/var/log/runsc/" to see why a
	// sandbox does not start.
	RunscFlags []string
	// Logger receives what goes wrong in the background.
	Logger *slog.Logger
}

// DefaultOptions are the defaults sandboxd uses.
func DefaultOptions(dir, runsc string) Options {
	return Options{
		Dir:          dir,
		Runsc:        runsc,
		Platform:     "systrap",
		CgroupParent: "skiff",
		PidsLimit:    4096,
		Logger:       slog.Default(),
	}
}

// Runtime is the gvisor runtime.
type Runtime struct {
	opts      Options
	format    func() (string, error) // ImageFormat, computed once
	noSwap    func() bool            // sandboxes held to no swap (sandboxrt.NoSwap)
	root      string                 // runsc --root, shared by every sandbox
	sandboxes string                 // <Dir>/sandboxes/<id>: bundle, meta, upper layer, checkpoint
	envd      sandboxrt.EnvdCopies
}

var (
	_ sandboxrt.Runtime       = (*Runtime)(nil)
	_ sandboxrt.StateCapturer = (*Runtime)(nil)
)

// meta is what the runtime remembers of a sandbox beyond runsc's state.
type meta struct {
	// Flags are runsc's global flags for this sandbox (but --root), the
	// same for every command on it, so that a restore is made like the
	// create was even if the runtime's options changed since.
	Flags       []string `json:"flags"`
	Log         string   `json:"log"`
	NetNS       string   `json:"netns"`
	MemoryLimit int64    `json:"memoryLimit"`
	DiskLimit   int64    `json:"diskLimit"`
	// Net is what runsc took from the network namespace at start.
	Net *netState `json:"net,omitempty"`
	// Paused is the sandbox's use when it was checkpointed.
	Paused *pausedUse `json:"paused,omitempty"`
	// Lowers are the template and the snapshot layers above it, topmost
	// first, when the sandbox has layers: its root is then their
	// read-only overlay, mounted at lower in its directory (again after a
	// host reboot, by a restore).
	Lowers []string `json:"lowers,omitempty"`
}

type pausedUse struct {
	CPU  time.Duration `json:"cpu"`
	Disk int64         `json:"disk"`
}

// New opens the runtime's directory. Sandboxes a previous sandboxd left
// there are found by Status, List and the rest.
func New(opts Options) (*Runtime, error) {
	if opts.Runsc == "" {
		return nil, errors.New("gvisor runtime: no runsc binary given")
	}
	if st, err := os.Stat(opts.Runsc); err != nil {
		return nil, fmt.Errorf("gvisor runtime: runsc: %w", err)
	} else if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("gvisor runtime: runsc %s is not an executable file", opts.Runsc)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	if strings.ContainsAny(dir, ",:") {
		return nil, fmt.Errorf("gvisor runtime: directory %q has ',' or ':', which runsc's --overlay2 cannot take", dir)
	}
	opts.Dir = dir
	if opts.Platform == "" {
		opts.Platform = "systrap"
	}
	if filepath.IsAbs(opts.CgroupParent) {
		return nil, fmt.Errorf("gvisor runtime: cgroup parent %q must be relative to sandboxd's cgroup", opts.CgroupParent)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Runtime{
		opts:      opts,
		root:      filepath.Join(dir, "runsc-root"),
		sandboxes: filepath.Join(dir, "sandboxes"),
		envd:      sandboxrt.EnvdCopies{Dir: filepath.Join(dir, "bin"), Perm: 0o700},
		format:    sync.OnceValues(func() (string, error) { return runscDigest(opts.Runsc) }),
		noSwap:    sync.OnceValue(func() bool { return sandboxrt.NoSwap(opts.CgroupParent, opts.Logger) }),
	}
	for _, d := range []string{dir, r.root, r.sandboxes} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor runtime: %w", err)
		}
	}
	return r, nil
}

// Options returns the options the runtime was made with.
func (r *Runtime) Options() Options { return r.opts }

// Name implements sandboxrt.Runtime.
func (r *Runtime) Name() string { return Name }

// Close releases what the runtime holds on the host beyond its sandboxes:
// the empty network namespace runsc pins (bind-mounts) under its root for
// the gofers. Sandboxes keep running; the next start pins a new one.
func (r *Runtime) Close() error {
	p := filepath.Join(r.root, "null-netns")
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("gvisor runtime: unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("gvisor runtime: %w", err)
	}
	return nil
}

func (r *Runtime) dir(id string) string     { return filepath.Join(r.sandboxes, id) }
func (r *Runtime) overlay(id string) string { return filepath.Join(r.dir(id), "overlay") }
func (r *Runtime) lower(id string) string   { return filepath.Join(r.dir(id), "lower") }

// mountLowers mounts the read-only overlay of m.Lowers at the sandbox's
// lower directory, unless it is mounted already.
func (r *Runtime) mountLowers(id string, m *meta) error {
	dir := r.lower(id)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if sandboxrt.IsMountPoint(dir) {
		return nil
	}
	for _, l := range m.Lowers {
		if strings.ContainsAny(l, ",:") {
			return fmt.Errorf("layer %q has ',' or ':', which an overlay's lowerdir cannot take", l)
		}
	}
	if err := sandboxrt.MountOverlay(dir, m.Lowers, "", ""); err != nil {
		return fmt.Errorf("mount the layers: %w", err)
	}
	return nil
}

// unmountLowers undoes mountLowers; nothing mounted is no error.
func (r *Runtime) unmountLowers(id string) error {
	if err := sandboxrt.Unmount(r.lower(id)); err != nil {
		return fmt.Errorf("unmount the layers: %w", err)
	}
	return nil
}

// A sandbox's checkpoint image moves through three directories of its own:
// Pause writes it to checkpoint.tmp and renames it checkpoint when whole;
// Resume renames it checkpoint.restoring before it restores from it, and
// removes it once the restore is done. So that whatever the moment
// sandboxd dies at, the next one knows a paused sandbox from a running one:
//   - checkpoint: paused, whether or not the sandbox's processes (ending)
//     are still there;
//   - checkpoint.restoring: running if the restore ended and the sandbox
//     runs (the image is then stale), paused otherwise;
//   - checkpoint.tmp: not an image (a pause that did not finish).
func (r *Runtime) checkpoint(id string) string { return filepath.Join(r.dir(id), "checkpoint") }
func (r *Runtime) restoring(id string) string  { return r.checkpoint(id) + ".restoring" }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (r *Runtime) readMeta(id string) (*meta, error) {
	data, err := os.ReadFile(filepath.Join(r.dir(id), "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(r.dir(id)); errors.Is(serr, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: runtime state: %w", id, err)
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
	return writeFileAtomic(filepath.Join(r.dir(id), "meta.json"), data, 0o600)
}

// writeFileAtomic replaces name with data, so a crash leaves the old
// content or the new, never half of it.
func writeFileAtomic(name string, data []byte, perm os.FileMode) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// validID matches runsc's container IDs, without a leading dot:
// [A-Za-z0-9_+-][A-Za-z0-9_+-.]{0,127}. (Not a regexp: compiled at package
// init, one would cost every sandbox's start, since libcontainer's init
// runs sandboxd's binary.)
func validID(id string) bool {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return false
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '+' || c == '-' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

// Start implements sandboxrt.Runtime.
func (r *Runtime) Start(ctx context.Context, spec *sandboxrt.Spec) (err error) {
	if !validID(spec.ID) {
		return fmt.Errorf("sandbox %q: invalid ID", spec.ID)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := r.dir(spec.ID)
	// A sandbox that exists is an error, and it is left alone.
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: create sandbox directory: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			if cerr := r.Stop(context.WithoutCancel(ctx), spec.ID); cerr != nil {
				r.opts.Logger.Error("cleaning up a sandbox that failed to start", "sandbox", spec.ID, "error", cerr)
			}
		}
	}()
	m, err := r.prepare(spec)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	log, err := openLog(m.Log)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer log.Close()
	if spec.Image != "" {
		// The sandbox's processes, memory and private layer come from
		// the image; it only reads the image, which other restores may
		// read at once.
		err := r.runscDetached(ctx, log, m.Flags, "restore", "--image-path="+filepath.Join(spec.Image, imageState), "--bundle", dir, "--detach", spec.ID)
		if err != nil {
			return fmt.Errorf("sandbox %s: runsc restore: %w", spec.ID, err)
		}
		return nil
	}
	// run --detach is create and start in one process, which saves one
	// start of runsc (tens of ms), and returns once envd was started;
	// detached, the sandbox is not tied to the command's life. runsc hands
	// its stdout and stderr to envd, and reports its own errors on stderr
	// too: the log from here on says what went wrong.
	if err := r.runscDetached(ctx, log, m.Flags, "run", "--detach", "--bundle", dir, spec.ID); err != nil {
		return fmt.Errorf("sandbox %s: runsc run: %w", spec.ID, err)
	}
	return nil
}

// upperTarName is the tar of the files put into a sandbox's root at start,
// in its directory. A restore does not read it: the image holds the
// sandbox's root as it was.
const upperTarName = "upper.tar"

// tmpKeeper is the file that keeps runsc from mounting a tmpfs on /tmp.
const (
	tmpKeeper     = "/tmp/.skiff-tmp"
	tmpKeeperText = "This file keeps /tmp on the sandbox's disk: gVisor mounts a tmpfs on an empty /tmp.\n"
)

// prepare writes the sandbox's bundle, upper-layer files and runtime state
// into its directory, and records its network.
func (r *Runtime) prepare(spec *sandboxrt.Spec) (*meta, error) {
	dir := r.dir(spec.ID)
	// runsc says only "waiting for sandbox to start: EOF" of a template
	// it cannot serve.
	rootfs, err := filepath.Abs(spec.Rootfs)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if st, err := os.Stat(rootfs); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("template %s is not a directory", rootfs)
	}
	var envd string
	if spec.Image != "" {
		// The envd the image's processes run, which the gofer checks
		// against the one it served when the image was taken.
		envd = filepath.Join(spec.Image, imageEnvd)
		if err := r.checkImage(spec.Image); err != nil {
			return nil, err
		}
	} else if envd, err = r.envd.Copy(spec.Envd); err != nil {
		return nil, err
	}
	if err := os.Mkdir(r.overlay(spec.ID), 0o700); err != nil {
		return nil, err
	}
	logPath := spec.Log
	if logPath == "" {
		logPath = os.DevNull
	}
	m := &meta{
		Log:         logPath,
		NetNS:       spec.NetNS,
		MemoryLimit: spec.MemoryMiB << 20,
		DiskLimit:   spec.DiskMiB << 20,
	}
	overlay := "root:dir=" + r.overlay(spec.ID)
	if spec.DiskMiB > 0 {
		overlay += fmt.Sprintf(",size=%dm", spec.DiskMiB)
	}
	m.Flags = []string{
		"--platform=" + r.opts.Platform,
		"--network=sandbox",
		"--overlay2=" + overlay,
		// setuid programs (sudo) work, as under the native runtime.
		"--allow-suid",
	}
	m.Flags = append(m.Flags, r.opts.RunscFlags...)
	if len(spec.Layers) > 0 {
		// The gofer serves the template with the snapshot's layers on it,
		// shared read-only, under the sandbox's own overlay.
		m.Lowers = append(slices.Clone(spec.Layers), rootfs)
		if err := r.mountLowers(spec.ID, m); err != nil {
			return nil, err
		}
		rootfs = r.lower(spec.ID)
	}
	// runsc mounts a tmpfs of its own on an empty /tmp, in the sandbox's
	// memory, where no snapshot sees it and no disk limit holds it. A file
	// there keeps /tmp on the root overlay, as the native runtime has it.
	files := maps.Clone(spec.Files)
	if files == nil {
		files = map[string][]byte{}
	}
	files[tmpKeeper] = []byte(tmpKeeperText)
	var upperTar string
	if len(files) > 0 {
		data, err := filesTar(rootfs, files)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, upperTarName), data, 0o600); err != nil {
			return nil, err
		}
		// runsc puts the sandbox's ID in for %ID%, and runs in the
		// sandboxes' directory (command): one path for every sandbox on
		// every host, which a restore must give as its image's was.
		upperTar = filepath.Join("%ID%", upperTarName)
		m.Flags = append(m.Flags, "--allow-rootfs-tar-annotation")
	}
	if spec.NetNS != "" {
		if m.Net, err = saveNetwork(spec.NetNS); err != nil {
			return nil, err
		}
	}
	cfg, err := json.MarshalIndent(r.config(spec, rootfs, envd, upperTar), "", "\t")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600); err != nil {
		return nil, err
	}
	if err := r.writeMeta(spec.ID, m); err != nil {
		return nil, fmt.Errorf("write runtime state: %w", err)
	}
	return m, nil
}

func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return f, nil
}

// runscError is a failed runsc command with what it said.
type runscError struct {
	err    error
	stderr string
}

func (e *runscError) Error() string {
	if e.stderr == "" {
		return e.err.Error()
	}
	return fmt.Sprintf("%v: %s", e.err, e.stderr)
}

func (e *runscError) Unwrap() error { return e.err }

// notExist tells whether a runsc command failed because runsc does not
// know the container.
func notExist(err error) bool {
	var re *runscError
	return errors.As(err, &re) && strings.Contains(re.stderr, "does not exist")
}

func (r *Runtime) command(ctx context.Context, flags []string, args ...string) *exec.Cmd {
	all := append(append([]string{"--root=" + r.root}, flags...), args...)
	cmd := exec.CommandContext(ctx, r.opts.Runsc, all...)
	// Relative paths runsc opens (the root's upper tar) are under the
	// sandboxes' directory.
	cmd.Dir = r.sandboxes
	// runsc must not take signals meant for sandboxd's process group, and
	// what it starts must not be in that group either.
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// runsc runs one runsc command that starts nothing and returns its
// standard output.
func (r *Runtime) runsc(ctx context.Context, flags []string, args ...string) ([]byte, error) {
	cmd := r.command(ctx, flags, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &runscError{err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// runscDetached runs a runsc command that starts the sandbox's processes
// (create, restore): they get log as their standard output and error, and
// keep it after the command returns, so no pipe to sandboxd may be among
// them. On failure, what runsc wrote to the log is in the error.
func (r *Runtime) runscDetached(ctx context.Context, log *os.File, flags []string, args ...string) error {
	off, _ := log.Seek(0, io.SeekEnd)
	cmd := r.command(ctx, flags, args...)
	cmd.Stdout, cmd.Stderr = log, log
	err := cmd.Run()
	if err == nil {
		return nil
	}
	return &runscError{err: err, stderr: logTail(log.Name(), off)}
}

// logTail is what was appended to the log at path after offset off, at
// most its last 4 KiB.
func logTail(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size()-off > 4096 {
		off = st.Size() - 4096
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(io.LimitReader(f, 4096))
	return strings.TrimSpace(string(data))
}

// runscState is the part of `runsc state` the runtime reads.
type runscState struct {
	Status string `json:"status"` // created, running, paused (frozen) or stopped
	Pid    int    `json:"pid"`
}

// state is runsc's state of the sandbox; nil when runsc has none.
func (r *Runtime) state(ctx context.Context, id string) (*runscState, error) {
	out, err := r.runsc(ctx, nil, "state", id)
	if notExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: runsc state: %w", id, err)
	}
	var st runscState
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: runsc state: %w", id, err)
	}
	// runsc checks the sandbox process with kill(pid, 0), which a zombie
	// not yet reaped by the host's init passes.
	if (st.Status == "running" || st.Status == "created" || st.Status == "paused") && !alive(st.Pid) {
		st.Status = "stopped"
	}
	return &st, nil
}

// status is where the sandbox is: runsc's state of it (nil when runsc has
// none) and its checkpoint images. It removes an image a finished restore
// left.
func (r *Runtime) status(ctx context.Context, id string) (sandboxrt.Status, *runscState, error) {
	st, err := r.state(ctx, id)
	if err != nil {
		return sandboxrt.Stopped, nil, err
	}
	if exists(r.checkpoint(id)) {
		return sandboxrt.Paused, st, nil
	}
	if st != nil && st.Status == "running" {
		if exists(r.restoring(id)) {
			if err := os.RemoveAll(r.restoring(id)); err != nil {
				r.opts.Logger.Warn("removing the checkpoint of a restored sandbox", "sandbox", id, "error", err)
			}
		}
		return sandboxrt.Running, st, nil
	}
	if exists(r.restoring(id)) {
		return sandboxrt.Paused, st, nil
	}
	if st != nil && st.Status == "paused" {
		return sandboxrt.Paused, st, nil // frozen by runsc pause, not by this runtime
	}
	if st != nil || exists(r.dir(id)) {
		// Created (envd never started), stopped, or a start that died
		// half-way.
		return sandboxrt.Stopped, st, nil
	}
	return sandboxrt.Stopped, nil, fmt.Errorf("%w: %s", sandboxrt.ErrNotFound, id)
}

// Status implements sandboxrt.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (sandboxrt.Status, error) {
	if !validID(id) {
		return sandboxrt.Stopped, fmt.Errorf("%w: %q", sandboxrt.ErrNotFound, id)
	}
	s, _, err := r.status(ctx, id)
	return s, err
}

// Pause implements sandboxrt.Runtime: runsc checkpoints the sandbox to its
// directory, memory included, and its processes end. Pausing a paused
// sandbox does nothing.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	m, err := r.readMeta(id)
	if err != nil {
		return err
	}
	s, st, err := r.status(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case s == sandboxrt.Paused:
		return nil
	case s != sandboxrt.Running:
		return fmt.Errorf("sandbox %s: pause: not running", id)
	}
	use := r.liveUse(ctx, id, m, st.Pid)
	m.Paused = &use
	if err := r.writeMeta(id, m); err != nil {
		return fmt.Errorf("sandbox %s: write runtime state: %w", id, err)
	}
	tmp := r.checkpoint(id) + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if _, err := r.runsc(ctx, m.Flags, "checkpoint", "--image-path="+tmp, id); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("sandbox %s: runsc checkpoint: %w", id, err)
	}
	if err := os.Rename(tmp, r.checkpoint(id)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	// The sandbox's processes end once their state is saved; delete ends
	// them now and drops runsc's record and the cgroups, so that only the
	// image is left.
	if err := r.destroy(ctx, id, m, st.Pid); err != nil {
		return fmt.Errorf("sandbox %s: after checkpoint: %w", id, err)
	}
	return nil
}

// Resume implements sandboxrt.Runtime: runsc restores the sandbox from its
// checkpoint, with the same processes and memory. Resuming a running
// sandbox does nothing.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	m, err := r.readMeta(id)
	if err != nil {
		return err
	}
	s, st, err := r.status(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case s == sandboxrt.Running:
		return nil
	case s != sandboxrt.Paused:
		return fmt.Errorf("sandbox %s: resume: not paused", id)
	case st != nil && st.Status == "paused" && !exists(r.checkpoint(id)) && !exists(r.restoring(id)):
		if _, err := r.runsc(ctx, m.Flags, "resume", id); err != nil {
			return fmt.Errorf("sandbox %s: runsc resume: %w", id, err)
		}
		return nil
	}
	if exists(r.checkpoint(id)) {
		// A restoring image beside it is older: a restore that ended.
		if err := os.RemoveAll(r.restoring(id)); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if err := os.Rename(r.checkpoint(id), r.restoring(id)); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	if err := r.restore(ctx, id, m, st != nil); err != nil {
		// The image is kept, for another try.
		if _, derr := r.runsc(context.WithoutCancel(ctx), m.Flags, "delete", "--force", id); derr != nil && !notExist(derr) {
			r.opts.Logger.Error("cleaning up a failed restore", "sandbox", id, "error", derr)
		}
		if rerr := os.Rename(r.restoring(id), r.checkpoint(id)); rerr != nil {
			r.opts.Logger.Error("keeping the checkpoint of a failed restore", "sandbox", id, "error", rerr)
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	m.Paused = nil
	if err := r.writeMeta(id, m); err != nil {
		return fmt.Errorf("sandbox %s: write runtime state: %w", id, err)
	}
	// The restore read all of the image (it was not --background).
	if err := os.RemoveAll(r.restoring(id)); err != nil {
		return fmt.Errorf("sandbox %s: remove checkpoint: %w", id, err)
	}
	return nil
}

// restore restores the sandbox from its image in checkpoint.restoring.
// known tells whether runsc still has a container of it: what an
// interrupted pause or restore left.
func (r *Runtime) restore(ctx context.Context, id string, m *meta, known bool) error {
	if known {
		if _, err := r.runsc(ctx, m.Flags, "delete", "--force", id); err != nil && !notExist(err) {
			return fmt.Errorf("runsc delete: %w", err)
		}
	}
	if m.Net != nil {
		if err := restoreNetwork(m.NetNS, m.Net); err != nil {
			return err
		}
	}
	if len(m.Lowers) > 0 {
		if err := r.mountLowers(id, m); err != nil {
			return err
		}
	}
	log, err := openLog(m.Log)
	if err != nil {
		return err
	}
	defer log.Close()
	// Restored, envd writes to the log again: runsc gives the restored
	// processes its own stdout and stderr, as create does.
	err = r.runscDetached(ctx, log, m.Flags, "restore", "--image-path="+r.restoring(id), "--bundle", r.dir(id), "--detach", id)
	if err != nil {
		return fmt.Errorf("runsc restore: %w", err)
	}
	return nil
}

// runscStats is the part of `runsc events --stats` the runtime reads.
type runscStats struct {
	Data struct {
		CPU struct {
			Usage struct {
				Total uint64 `json:"total"` // ns
			} `json:"usage"`
		} `json:"cpu"`
		Memory struct {
			Usage struct {
				Usage uint64 `json:"usage"`
			} `json:"usage"`
		} `json:"memory"`
	} `json:"data"`
}

// Stats implements sandboxrt.Runtime. The numbers are the sentry's: the
// workload's CPU time and memory as gVisor accounts them, and the space
// its overlay's upper layer takes in its file. A paused sandbox reports
// the CPU time and disk of when it was paused, and no memory.
func (r *Runtime) Stats(ctx context.Context, id string) (sandboxrt.Stats, error) {
	m, err := r.readMeta(id)
	if err != nil {
		return sandboxrt.Stats{}, err
	}
	out := sandboxrt.Stats{Time: time.Now(), MemoryLimit: m.MemoryLimit, DiskLimit: m.DiskLimit}
	status, st, err := r.status(ctx, id)
	if err != nil {
		return sandboxrt.Stats{}, err
	}
	if status == sandboxrt.Paused && m.Paused != nil {
		out.CPUUsage, out.DiskUsed = m.Paused.CPU, m.Paused.Disk
		return out, nil
	}
	if status != sandboxrt.Running {
		return out, nil
	}
	data, err := r.runsc(ctx, nil, "events", "--stats", id)
	if err != nil {
		return sandboxrt.Stats{}, fmt.Errorf("sandbox %s: runsc events: %w", id, err)
	}
	var s runscStats
	if err := json.Unmarshal(data, &s); err != nil {
		return sandboxrt.Stats{}, fmt.Errorf("sandbox %s: runsc events: %w", id, err)
	}
	out.CPUUsage = time.Duration(s.Data.CPU.Usage.Total)
	out.MemoryUsed = int64(s.Data.Memory.Usage.Usage)
	out.DiskUsed = filestoreUsage(st.Pid, r.overlay(id))
	return out, nil
}

// liveUse is the CPU time and disk of a running sandbox, as well as it can
// be had; zero where not.
func (r *Runtime) liveUse(ctx context.Context, id string, m *meta, pid int) pausedUse {
	use := pausedUse{Disk: filestoreUsage(pid, r.overlay(id))}
	if data, err := r.runsc(ctx, m.Flags, "events", "--stats", id); err == nil {
		var s runscStats
		if json.Unmarshal(data, &s) == nil {
			use.CPU = time.Duration(s.Data.CPU.Usage.Total)
		}
	}
	return use
}

// Stop implements sandboxrt.Runtime. It works on sandboxes in any state,
// paused (checkpointed) ones included.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if !validID(id) {
		return nil // nothing of it can exist
	}
	m, err := r.readMeta(id)
	if err != nil {
		m = &meta{} // runsc needs none of the flags to delete
	}
	pid := 0
	if st, err := r.state(ctx, id); err == nil && st != nil {
		pid = st.Pid
	}
	var errs []error
	if err := r.destroy(ctx, id, m, pid); err != nil {
		errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
	}
	if err := r.unmountLowers(id); err != nil {
		errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(r.dir(id)); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: remove its directory: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// destroy ends the sandbox's processes (pid is its sandbox process, 0 if
// not known) and removes runsc's record of it and its cgroups.
func (r *Runtime) destroy(ctx context.Context, id string, m *meta, pid int) error {
	if _, err := r.runsc(ctx, m.Flags, "delete", "--force", id); err != nil && !notExist(err) {
		return fmt.Errorf("runsc delete: %w", err)
	}
	var errs []error
	if pid > 0 {
		if err := waitDead(ctx, pid, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := cgroups.Remove(filepath.Join(r.opts.CgroupParent, id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CaptureLayer implements sandboxrt.Snapshotter: runsc tar rootfs-upper
// of the sandbox, frozen (runsc pause) for it, unpacked into dir. A sandbox
// checkpointed to disk (paused) has no running sentry to ask: resume it
// first.
func (r *Runtime) CaptureLayer(ctx context.Context, id, dir string) error {
	return r.frozen(ctx, id, func(m *meta) error { return r.tarUpper(ctx, id, m, dir) })
}

// Files of a state image (CaptureState), in its directory.
const (
	// imageState is runsc checkpoint's image.
	imageState = "state"
	// imageEnvd is the envd binary the sandbox ran, for the restores to
	// serve (a link to the runtime's copy when they share a filesystem).
	imageEnvd = "envd"
	// imageMeta is what else a restore needs: imageInfo.
	imageMeta = "image.json"
)

// imageInfo is an image's imageMeta.
type imageInfo struct {
	// Format is the runtime's ImageFormat when the image was taken.
	Format string `json:"format"`
}

// CaptureState implements sandboxrt.StateCapturer: with the sandbox
// frozen (runsc pause), runsc tar rootfs-upper into layerDir and runsc
// checkpoint --leave-running into imageDir, then the sandbox runs on. The
// image holds the sentry's whole state, the private layer included (its
// file store is the sentry's memory), and a link to the envd it runs.
func (r *Runtime) CaptureState(ctx context.Context, id, layerDir, imageDir string) error {
	format, err := r.ImageFormat()
	if err != nil {
		return err
	}
	return r.frozen(ctx, id, func(m *meta) error {
		if err := r.tarUpper(ctx, id, m, layerDir); err != nil {
			return err
		}
		if err := os.Mkdir(imageDir, 0o700); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if err := r.linkEnvd(id, filepath.Join(imageDir, imageEnvd)); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if _, err := r.runsc(ctx, m.Flags, "checkpoint", "--leave-running", "--image-path="+filepath.Join(imageDir, imageState), id); err != nil {
			return fmt.Errorf("sandbox %s: runsc checkpoint: %w", id, err)
		}
		info, err := json.Marshal(imageInfo{Format: format})
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(imageDir, imageMeta), info, 0o600)
	})
}

// linkEnvd puts the envd binary sandbox id runs at dst: a hard link to
// the runtime's copy, or a copy of it on another filesystem.
func (r *Runtime) linkEnvd(id, dst string) error {
	var cfg struct {
		Mounts []struct {
			Destination string `json:"destination"`
			Source      string `json:"source"`
		} `json:"mounts"`
	}
	data, err := os.ReadFile(filepath.Join(r.dir(id), "config.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	src := ""
	for _, mnt := range cfg.Mounts {
		if mnt.Destination == sandboxrt.EnvdPath {
			src = mnt.Source
		}
	}
	if src == "" {
		return errors.New("config.json mounts no envd")
	}
	if err := os.Link(src, dst); err == nil || !errors.Is(err, unix.EXDEV) {
		return err
	}
	return layer.CopySparse(src, dst)
}

// checkImage reports an image this runtime cannot restore: one another
// runsc took (ErrImageFormat), or one not whole.
func (r *Runtime) checkImage(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, imageMeta))
	if err != nil {
		return fmt.Errorf("state image: %w", err)
	}
	var info imageInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return fmt.Errorf("state image %s: %w", dir, err)
	}
	format, err := r.format()
	if err != nil {
		return err
	}
	if info.Format != format {
		return fmt.Errorf("%w: state image %s is %s, this runtime restores %s", sandboxrt.ErrImageFormat, dir, info.Format, format)
	}
	return nil
}

// ImageFormat implements sandboxrt.StateCapturer: runsc's build (a digest
// of its binary), since an image restores only under the runsc that took
// it.
func (r *Runtime) ImageFormat() (string, error) {
	return r.format()
}

// runscDigest is the format of the images of the runsc binary at path.
func runscDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("gvisor runtime: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("gvisor runtime: %w", err)
	}
	return fmt.Sprintf("gvisor/runsc-sha256:%x", h.Sum(nil)[:12]), nil
}

// frozen runs fn with the running sandbox id frozen (runsc pause), and
// thaws it after.
func (r *Runtime) frozen(ctx context.Context, id string, fn func(*meta) error) error {
	m, err := r.readMeta(id)
	if err != nil {
		return err
	}
	s, _, err := r.status(ctx, id)
	if err != nil {
		return err
	}
	if s != sandboxrt.Running {
		return fmt.Errorf("sandbox %s: copy its layer: %s, not running", id, s)
	}
	if err := r.checkCaptureFits(ctx, id); err != nil {
		return err
	}
	if _, err := r.runsc(ctx, m.Flags, "pause", id); err != nil {
		return fmt.Errorf("sandbox %s: runsc pause: %w", id, err)
	}
	defer func() {
		if _, err := r.runsc(context.WithoutCancel(ctx), m.Flags, "resume", id); err != nil {
			r.opts.Logger.Error("resuming a sandbox after copying its layer", "sandbox", id, "error", err)
		}
	}()
	return fn(m)
}

// tarUpper unpacks the frozen sandbox's private layer into dir.
func (r *Runtime) tarUpper(ctx context.Context, id string, m *meta, dir string) error {
	tarPath := dir + ".tar"
	defer os.Remove(tarPath)
	if _, err := r.runsc(ctx, m.Flags, "tar", "rootfs-upper", "--file", tarPath, id); err != nil {
		return fmt.Errorf("sandbox %s: runsc tar rootfs-upper: %w", id, err)
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := layer.FromTar(f, dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// captureHeadroom is the memory kept free beside the copy of a file.
const captureHeadroom = 64 << 20

// checkCaptureFits refuses a copy that would kill the sandbox: runsc tar
// rootfs-upper reads each file whole into the sentry's memory, inside the
// sandbox's memory limit, beside the file's own pages, and a file that
// does not fit gets the whole sandbox killed by the host's OOM killer.
// Measured here: 1 GiB written was killed under limits of 512 MiB and
// 1.5 GiB, and copied under 2.5 GiB. The largest file is not known from
// outside, so the check takes all the layer's data as one file, twice: it
// can refuse a sandbox whose files would have fitted one by one, never
// kill one.
func (r *Runtime) checkCaptureFits(ctx context.Context, id string) error {
	st, err := r.Stats(ctx, id)
	if err != nil || st.MemoryLimit <= 0 {
		return nil //nolint:nilerr // no limit known: nothing to check against
	}
	free := st.MemoryLimit - st.MemoryUsed - captureHeadroom
	if 2*st.DiskUsed > free {
		return fmt.Errorf("%w: under gVisor each file is copied through the sandbox's own memory, which needs twice its files (%d MiB) free, and %d MiB of its %d MiB are; give it more memory, or run it on the native runtime",
			sandboxrt.ErrCaptureTooLarge, st.DiskUsed>>20, max(free, 0)>>20, st.MemoryLimit>>20)
	}
	return nil
}

// List implements sandboxrt.Runtime: the sandboxes with a directory, and
// any container runsc knows under the runtime's root.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(r.sandboxes)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && validID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	out, err := r.runsc(ctx, nil, "list", "--quiet")
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: runsc list: %w", err)
	}
	for _, id := range strings.Fields(string(out)) {
		if validID(id) && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}
