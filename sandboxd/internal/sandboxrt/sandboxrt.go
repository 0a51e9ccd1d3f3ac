// Package sandboxrt is the seam between sandboxd and the runtimes that run
// its sandboxes (`--runtime`): native (namespaces through libcontainer) and
// gvisor (runsc). sandboxd owns everything around a sandbox — its record,
// network namespace, address, token and deadline — and a runtime owns only
// the sandbox's processes, root filesystem and cgroup.
//
// A runtime keeps whatever it needs to find a sandbox again under its own
// directory, so that after sandboxd is killed and restarted Status and Stop
// work on sandboxes started by the previous process. A sandbox's processes are
// never children that die with sandboxd.
package sandboxrt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// EnvdPath is where every runtime puts envd in a sandbox.
const EnvdPath = "/usr/bin/envd"

// ErrNotFound is returned for a sandbox the runtime does not know.
var ErrNotFound = errors.New("sandbox not known to the runtime")

// Spec is one sandbox to start.
type Spec struct {
	// ID is the sandbox ID (shared/sandboxid).
	ID string
	// Rootfs is the template's read-only root filesystem on the host. The
	// runtime gives the sandbox a private writable view of it; the template
	// itself is never written.
	Rootfs string
	// Layers are snapshot layers (host directories in package layer's
	// format, read-only, shared) stacked on Rootfs, topmost first: the
	// sandbox sees the template with each layer's changes, under its own
	// private layer.
	Layers []string
	// CPUMilli, MemoryMiB and DiskMiB are the sandbox's limits.
	CPUMilli  int64
	MemoryMiB int64
	DiskMiB   int64
	// NetNS is the path of the network namespace sandboxd prepared for the
	// sandbox (veth, address, routes); the sandbox joins it.
	NetNS string
	// Hostname inside the sandbox.
	Hostname string
	// Envd is the host path of the static envd binary. It is bind-mounted
	// read-only into the sandbox at EnvdPath and runs as its init with
	// EnvdArgs.
	Envd     string
	EnvdArgs []string
	// EnvdPort is the port envd listens on. A runtime may make the
	// listening socket itself, in the sandbox's network namespace, and
	// hand it to envd (--listen-fd): then a request to envd made as soon
	// as Start returns waits for envd instead of being refused.
	EnvdPort int
	// Files are small files written into the sandbox's root before start
	// (for example /etc/resolv.conf and /etc/hosts), by path inside it.
	Files map[string][]byte
	// Log is the host path of the file that receives envd's stdout and
	// stderr. It outlives sandboxd, unlike a pipe. A runtime may keep the
	// file elsewhere (on the sandbox's own disk) and make Log a link to
	// it.
	Log string
	// Volumes are host directories mounted read-write in the sandbox, each
	// at its Path; a file's owner inside is its owner on the host (native:
	// an idmapped mount into the sandbox's uid range), so that every
	// sandbox that mounts one sees the same owners.
	Volumes []Volume
	// Image, when set, is a state image (StateCapturer.CaptureState) the
	// sandbox is restored from instead of booting: it starts with the
	// memory, processes and private layer of the sandbox the image was
	// taken of. Rootfs and Layers must then be what that sandbox had, and
	// Files are ignored (the image holds its files). The image is only
	// read, so many sandboxes may be restored from one at once.
	Image string
}

// Volume is a host directory mounted in a sandbox.
type Volume struct {
	// Source is the directory on the host; Path the absolute path inside.
	Source, Path string
}

// Status is what a runtime knows of a sandbox.
type Status int

const (
	// Stopped means no process of the sandbox runs (it exited, was killed,
	// or never started). Stop still releases what it holds.
	Stopped Status = iota
	// Running means its processes run.
	Running
	// Paused means its processes exist but are frozen (native) or
	// checkpointed to disk (gvisor).
	Paused
)

func (s Status) String() string {
	switch s {
	case Running:
		return "running"
	case Paused:
		return "paused"
	default:
		return "stopped"
	}
}

// Stats is a sandbox's resource use at one instant.
type Stats struct {
	Time time.Time
	// CPUUsage is the CPU time used by all its processes since start.
	CPUUsage time.Duration
	// MemoryUsed and MemoryLimit are in bytes.
	MemoryUsed  int64
	MemoryLimit int64
	// DiskUsed is the bytes written to its private layer; DiskLimit the cap.
	DiskUsed  int64
	DiskLimit int64
}

// Limits are the resources a sandbox may use.
type Limits struct {
	CPUMilli, MemoryMiB, DiskMiB int64
}

// Preparer is a runtime that can do the work of a start ahead of time: a
// prepared sandbox has its root, cgroup, namespaces, mounts and seccomp
// filter, and its init stopped just before it runs envd. Nothing of a
// workload runs in it, and it takes no CPU. StartPrepared then gives it
// the limits of the create that takes it and lets its init run envd.
type Preparer interface {
	// Prepare does all of Start(spec) but run envd. On error nothing of
	// the sandbox is left behind. Stop releases a prepared sandbox.
	Prepare(ctx context.Context, spec *Spec) error
	// StartPrepared sets the prepared sandbox's limits and runs envd,
	// returning once envd runs, as Start does.
	StartPrepared(ctx context.Context, id string, limits Limits) error
}

// ExitWatcher is a runtime that says when a sandbox ends by itself: its
// init (envd) died, OOM-killed or crashed, so nothing of it answers.
type ExitWatcher interface {
	// WaitExit waits until the process that runs sandbox id now exits,
	// or ctx ends, and says how it ended as far as the runtime knows. It
	// fails at once when nothing of the sandbox runs (stopped, or paused
	// to disk). A process that ends because the sandbox is paused or
	// stopped returns too: the caller checks Status.
	WaitExit(ctx context.Context, id string) (Exit, error)
}

// ErrCaptureTooLarge is a sandbox whose files the runtime cannot copy
// without harming it; the error says why and what would let it.
var ErrCaptureTooLarge = errors.New("the sandbox's files cannot be copied")

// Snapshotter is a runtime that can copy a sandbox's files: what it wrote
// on top of its template (its private writable layer).
type Snapshotter interface {
	// CaptureLayer writes the running sandbox's writable layer into dir,
	// which must not exist, in package layer's format. The sandbox is
	// frozen for the copy, so the copy is of one instant, and runs again
	// after it. Its layers (Spec.Layers) are not copied: a snapshot keeps
	// them below the new one.
	CaptureLayer(ctx context.Context, id, dir string) error
}

// InPlacePauser is a runtime whose Pause freezes a sandbox where it runs
// (its memory stays; nothing is written) and whose Resume thaws it, so
// that a sandbox paused to its files is copied frozen and stopped without
// running in between: what it wrote after the copy would be lost.
type InPlacePauser interface {
	PausesInPlace()
}

// Salvager is a runtime that keeps a sandbox's writable layer on disk when
// its processes are gone (a host reboot), and can copy it then.
type Salvager interface {
	// SalvageLayer writes the writable layer of sandbox id, whose
	// processes are gone (Status Stopped), into dir, which must not
	// exist, as CaptureLayer would have.
	SalvageLayer(ctx context.Context, id, dir string) error
}

// StateCapturer is a Snapshotter that can also save a running sandbox's
// memory and processes, for sandboxes restored from them (Spec.Image).
type StateCapturer interface {
	Snapshotter
	// CaptureState writes the running sandbox's writable layer into
	// layerDir (as CaptureLayer does) and its whole state (memory,
	// processes, and that layer again as the sandbox holds it) into
	// imageDir, both of one instant: the sandbox is frozen for both, and
	// runs again after them. Neither directory may exist.
	CaptureState(ctx context.Context, id, layerDir, imageDir string) error
	// ImageFormat names what can restore an image CaptureState writes
	// (the runtime and its build): an image of another format is not
	// restorable here, and Start refuses it with ErrImageFormat.
	ImageFormat() (string, error)
}

// ErrImageFormat is a state image that this runtime cannot restore (taken
// by another runtime, or another build of it).
var ErrImageFormat = errors.New("the state image is of another format")

// Exit is how a sandbox's init ended.
type Exit struct {
	// Known: the runtime saw the exit status (it started the sandbox in
	// this process); then Code is the exit code, or Signal the signal
	// that killed the init.
	Known  bool
	Code   int
	Signal syscall.Signal
	// OOMKills is how many processes the sandbox's memory limit had
	// killed, the init among them perhaps; -1 when not known.
	OOMKills int64
}

// String says how the sandbox ended, in words for its log.
func (e Exit) String() string {
	var parts []string
	switch {
	case !e.Known:
		parts = append(parts, "envd (its init) exited")
	case e.Signal != 0:
		parts = append(parts, fmt.Sprintf("envd (its init) was killed by signal %d (%s)", int(e.Signal), e.Signal))
	default:
		parts = append(parts, fmt.Sprintf("envd (its init) exited with code %d", e.Code))
	}
	if e.OOMKills > 0 {
		parts = append(parts, fmt.Sprintf("the memory limit killed %d process(es)", e.OOMKills))
	}
	return strings.Join(parts, "; ")
}

// Runtime runs sandboxes. Implementations are safe for concurrent use on
// different sandboxes; sandboxd serialises calls for one sandbox.
type Runtime interface {
	// Name is the --runtime value: "native" or "gvisor".
	Name() string
	// Start starts the sandbox and returns once its init (envd) runs.
	// Readiness of envd itself is sandboxd's to check. On error nothing of
	// the sandbox is left behind.
	Start(ctx context.Context, spec *Spec) error
	// Status reports the sandbox's state; ErrNotFound when the runtime has
	// no trace of it.
	Status(ctx context.Context, id string) (Status, error)
	// Pause stops the sandbox using CPU, keeping its memory (native:
	// freezer) or saving it to disk (gvisor).
	Pause(ctx context.Context, id string) error
	// Resume undoes Pause.
	Resume(ctx context.Context, id string) error
	// Stats reports the sandbox's resource use.
	Stats(ctx context.Context, id string) (Stats, error)
	// Stop kills every process of the sandbox and releases everything the
	// runtime holds for it (mounts, cgroups, state). Stopping a sandbox that
	// is unknown or already stopped is not an error.
	Stop(ctx context.Context, id string) error
	// List returns the IDs of every sandbox the runtime holds state for,
	// running or not, so sandboxd can clean up those it has no record of.
	List(ctx context.Context) ([]string, error)
}
