package e2bapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Backend is what the handlers need from the fleet. Every method that takes
// a team acts only on that team's sandboxes: a sandbox of another team is
// ErrNotFound, exactly like a missing one.
//
// Errors are classified with the sentinels below (wrapped with %w, or an
// *InvalidError); anything else is answered as a 500 and logged.
type Backend interface {
	// Create starts a sandbox. The template has been resolved with Template
	// and every parameter validated.
	Create(ctx context.Context, team string, p CreateParams) (*Sandbox, error)
	// Get returns one sandbox, running or paused.
	Get(ctx context.Context, team, id string) (*Sandbox, error)
	// List returns the team's sandboxes in any of states (never empty), in
	// any order; the handlers filter, order and paginate.
	List(ctx context.Context, team string, states []State) ([]Sandbox, error)
	// Kill removes a sandbox, running or paused.
	Kill(ctx context.Context, team, id string) error
	// SetTimeout sets the sandbox's end to now + timeout. With onlyExtend it
	// never moves the end earlier. A timeout of 0 without onlyExtend ends
	// the sandbox now, as its end would: killed, or paused when it was
	// created with auto-pause.
	SetTimeout(ctx context.Context, team, id string, timeout time.Duration, onlyExtend bool) error
	// Connect makes sure the sandbox runs and lives until at least
	// now + timeout: a paused sandbox is resumed with its end at
	// now + timeout (resumed = true); a running one keeps its end if that is
	// later. A timeout of 0 leaves a running sandbox's end as it is, and
	// is an *InvalidError for a paused one. With reboot (e2b's memory:
	// false, the SDK's onResume: 'reboot') a paused sandbox boots afresh on
	// its files, whatever its pause kept. The returned Sandbox carries the
	// envd access token.
	Connect(ctx context.Context, team, id string, timeout time.Duration, reboot bool) (sb *Sandbox, resumed bool, err error)
	// Pause pauses a running sandbox; ErrConflict only if it is paused now
	// (answered with e2b's "already paused", which the SDK's pause() reads
	// as false). Any other refusal is another category: an *InvalidError
	// with the host's reason, ErrNotFound when the sandbox ended meanwhile.
	// keepMemory is e2b's "memory" flag: false keeps the files only (every
	// process ends, the memory is freed; the next connect boots it).
	Pause(ctx context.Context, team, id string, keepMemory bool) error
	// Metrics returns the resource samples the sandbox's host keeps, oldest
	// first.
	Metrics(ctx context.Context, team, id string) ([]Metric, error)
	// Logs returns lines of the sandbox's log that q asks for, oldest
	// first: a page, perhaps shorter than q's limit (the host bounds the
	// bytes of an answer).
	Logs(ctx context.Context, team, id string, q LogQuery) ([]LogEntry, error)
	// Templates returns the templates the team may start.
	Templates(ctx context.Context, team string) ([]Template, error)
	// Template resolves a template ID or alias (as an SDK passes it to
	// create), or one of the team's snapshots (Template.Snapshot is then
	// set); ErrNotFound if the team has none by that name.
	Template(ctx context.Context, team, name string) (*Template, error)
	// Snapshot captures a running sandbox's files as a snapshot of team,
	// with an optional name ("name" or "name:tag"); ErrConflict when the
	// sandbox is paused.
	Snapshot(ctx context.Context, team, id, name string) (*Snapshot, error)
	// Snapshots returns the team's snapshots that f selects, in any order.
	Snapshots(ctx context.Context, team string, f SnapshotFilter) ([]Snapshot, error)
	// DeleteSnapshot deletes the team's snapshot ref names; ErrNotFound if
	// there is none.
	DeleteSnapshot(ctx context.Context, team string, ref SnapshotRef) error
	// Fork starts count sandboxes of team from a running sandbox's files,
	// each with timeout; each succeeds or fails on its own (an error for
	// the whole call is one before any fork: the sandbox not found).
	Fork(ctx context.Context, team, id string, count int, timeout time.Duration) ([]ForkResult, error)
	// UpdateNetwork replaces a running sandbox's outbound rules (validated);
	// new connections follow them when it returns. A paused sandbox is
	// ErrNotFound, as in e2b.
	UpdateNetwork(ctx context.Context, team, id string, u NetworkUpdate) error
	// CreateVolume makes an empty volume of team (its name checked);
	// ErrVolumeExists when the team has one by that name.
	CreateVolume(ctx context.Context, team, name string) (*Volume, error)
	// Volumes returns team's volumes, in any order.
	Volumes(ctx context.Context, team string) ([]Volume, error)
	// Volume returns team's volume id with what it holds; ErrNotFound.
	Volume(ctx context.Context, team, id string) (*Volume, error)
	// DeleteVolume deletes team's volume id and its files; ErrNotFound,
	// or ErrConflict while a sandbox (running or paused) mounts it.
	DeleteVolume(ctx context.Context, team, id string) error
	// ServeVolumeContent answers a request of e2b's volume content API
	// (kind: dir, path or file) for team's volume id, whose token the
	// caller holds, from a host that serves it; it writes e2b's content
	// errors itself.
	ServeVolumeContent(w http.ResponseWriter, r *http.Request, team, id, kind string)
}

// NetworkUpdate is a sandbox's new outbound rules (e2b's PUT
// /sandboxes/{id}/network).
type NetworkUpdate struct {
	// AllowOut and DenyOut replace the sandbox's; nil clears.
	AllowOut, DenyOut []string
	// AllowInternetAccess, when set, replaces the sandbox's.
	AllowInternetAccess *bool
}

// HealthChecker is an optional capability of a Backend: when implemented,
// GET /health answers 503 while Healthy returns an error.
type HealthChecker interface {
	Healthy(ctx context.Context) error
}

// State is a sandbox's state as e2b names it.
type State string

// The states a listed sandbox can be in.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Sandbox is a sandbox as the handlers render it.
type Sandbox struct {
	ID         string
	TemplateID string
	// Alias is the template alias the sandbox was created with, if any.
	Alias string
	// Node is the name of the node that holds the sandbox; it is e2b's
	// clientID.
	Node  string
	State State
	// EnvdVersion is what the sandbox's envd reports.
	EnvdVersion string
	// EnvdAccessToken is the token envd checks (X-Access-Token); empty when
	// envd checks none. Create and Connect must set it when there is one.
	EnvdAccessToken string
	// TrafficAccessToken is what a request for any of the sandbox's ports
	// but envd's must carry (header e2b-traffic-access-token) when its
	// public traffic is off; empty when it is public. Create and Connect
	// must set it when there is one.
	TrafficAccessToken string
	StartedAt          time.Time
	EndAt              time.Time
	CPUMilli           int64
	MemoryMB           int64
	DiskMB             int64
	Metadata           map[string]string
	// AutoPause means the sandbox pauses, rather than dies, at EndAt.
	AutoPause bool
	// AutoResume means traffic to the paused sandbox resumes it.
	AutoResume bool
	// AllowInternetAccess is nil when the creator did not say.
	AllowInternetAccess *bool
	// AllowPublicTraffic is e2b's network.allowPublicTraffic; nil when the
	// backend does not know (GET /sandboxes/{id} then has no network).
	AllowPublicTraffic *bool
	// AllowOut and DenyOut are the sandbox's outbound rules as given (e2b's
	// network.allowOut and denyOut); nil when it has none.
	AllowOut, DenyOut []string
	// MaskRequestHost is e2b's network.maskRequestHost, or empty.
	MaskRequestHost string
	// VolumeMounts are the volumes it mounts.
	VolumeMounts []VolumeMount
}

// CreateParams is a validated create request.
type CreateParams struct {
	// TemplateID is the resolved template (Template.ID).
	TemplateID string
	// Alias is the name the caller used when it was an alias, else empty.
	Alias   string
	Timeout time.Duration
	// Secure asks for an envd access token (always true for v2; the v1
	// "secure" field otherwise). A backend that always issues one may
	// ignore it: the token is returned whenever the Sandbox carries one.
	Secure bool
	// AllowInternetAccess is nil when the caller did not say.
	AllowInternetAccess *bool
	AutoPause           bool
	// AutoPauseMemory is e2b's autoPauseMemory (default true).
	AutoPauseMemory bool
	// AutoResume is e2b's autoResume.enabled: a request for the paused
	// sandbox's ports resumes it.
	AutoResume bool
	// AllowPublicTraffic is e2b's network.allowPublicTraffic, nil when the
	// caller did not say (public). False: the sandbox's ports but envd's
	// need its TrafficAccessToken.
	AllowPublicTraffic *bool
	// AllowOut and DenyOut are e2b's network.allowOut and denyOut
	// (validated: shared/egress); nil when not given.
	AllowOut, DenyOut []string
	// MaskRequestHost is e2b's network.maskRequestHost: the Host requests
	// for the sandbox's ports but envd's reach it with ("${PORT}" is the
	// port).
	MaskRequestHost string
	// VolumeMounts are e2b's volumeMounts (paths checked; names for the
	// backend to find among the team's volumes).
	VolumeMounts []VolumeMount
	Metadata     map[string]string
	EnvVars      map[string]string
	// Snapshot, when set, is the snapshot to start from (TemplateID is then
	// its ID).
	Snapshot *Snapshot
}

// Metric is one resource sample, in e2b's SandboxMetric terms.
type Metric struct {
	Timestamp  time.Time
	CPUCount   int32
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// LogQuery is which lines of a sandbox's log Logs returns.
type LogQuery struct {
	// Start and End bound the lines' times, both included; zero is open.
	Start, End time.Time
	// Limit is the most lines.
	Limit int
	// Forward asks for the window's oldest lines, else its newest.
	Forward bool
	// MinLevel keeps lines of this level or above (debug, info, warn,
	// error); empty keeps every line.
	MinLevel string
	// Search keeps lines whose text has it.
	Search string
}

// LogEntry is one line of a sandbox's output.
type LogEntry struct {
	Timestamp time.Time
	Line      string
	// Level is debug, info, warn or error; empty means info.
	Level string
	// Source is envd, stdout or stderr.
	Source string
}

// Template is a template as the handlers render it.
type Template struct {
	ID      string
	Aliases []string
	// Version identifies the template's current build; the e2b buildID is
	// derived from ID and Version.
	Version     string
	CPUMilli    int64
	MemoryMB    int64
	DiskMB      int64
	EnvdVersion string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// Snapshot is set when the name resolved to one of the team's
	// snapshots: a create starts from it, on its node.
	Snapshot *Snapshot
}

// The error categories a Backend returns; the handlers map each to one
// HTTP status in one place (writeBackendError).
var (
	// ErrNotFound: no such sandbox or template for this team → 404.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the sandbox is in the wrong state (pause of a paused
	// sandbox) → 409.
	ErrConflict = errors.New("conflict")
	// ErrRateLimited: a per-team limit is reached → 429.
	ErrRateLimited = errors.New("rate limited")
	// ErrCapacity: no node can take the sandbox → 503
	// sandbox_capacity_unavailable.
	ErrCapacity = errors.New("no capacity")
	// ErrPlacementTimeout: placement did not finish in time → 504
	// sandbox_placement_timeout.
	ErrPlacementTimeout = errors.New("placement timed out")
	// ErrUnsupported: a feature Skiff does not implement → 501.
	ErrUnsupported = errors.New("not supported by Skiff yet")
	// ErrUnavailable: the sandbox's host does not answer (dead, or cut
	// off, and not yet stale) → 503 sandbox_host_unavailable, retryable.
	ErrUnavailable = errors.New("the sandbox's host does not answer")
)

// VolumeHostError is a failure that comes from where volumes live: the
// host of a volume does not answer (Err wraps ErrUnavailable), or a create
// pinned to the hosts of the volumes it mounts finds no room there (Err
// wraps ErrCapacity) → 503 with a message naming the volumes and hosts.
type VolumeHostError struct {
	Volumes []string // names, or IDs when only the ID is known
	Hosts   []string
	Err     error
}

func (e *VolumeHostError) Error() string {
	return fmt.Sprintf("%s: %v", e.Message(), e.Err)
}

func (e *VolumeHostError) Unwrap() error { return e.Err }

// Message is the text the caller sees.
func (e *VolumeHostError) Message() string {
	noun, verb := "volume", "lives"
	if len(e.Volumes) > 1 {
		noun, verb = "volumes", "live"
	}
	vols := fmt.Sprintf("%s '%s'", noun, strings.Join(e.Volumes, "', '"))
	hosts := strings.Join(e.Hosts, ", ")
	if errors.Is(e.Err, ErrCapacity) {
		return fmt.Sprintf("the sandbox mounts %s that %s on %s, which has no room for it now (or does not hold its template); retry later", vols, verb, hosts)
	}
	return fmt.Sprintf("%s %s on %s, which is not answering; retry later", vols, verb, hosts)
}

// ConflictError is an ErrConflict whose Reason is shown to the caller as
// it is → 409.
type ConflictError struct{ Reason string }

func (e *ConflictError) Error() string { return e.Reason }

// Is makes a ConflictError an ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// InvalidError is a request the backend refuses because of one field → 400.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Invalid returns an *InvalidError for field; with no field, the reason is
// the whole message (e2b's own words, where they are matched).
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
