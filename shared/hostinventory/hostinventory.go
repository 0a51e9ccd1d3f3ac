// Package hostinventory mirrors one sandboxd — its Info and, through its
// Watch stream, every sandbox on it — as the NodeInventory that describes the
// host to the fleet. vk-sandbox publishes that object to Kubernetes; the
// apiserver's single-host mode feeds it straight into a static inventory
// source. Both build it here, so a host looks the same to every reader.
package hostinventory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// Options tune a Host.
type Options struct {
	// InfoInterval is how often Info (capacity, templates) is asked again
	// while the Watch stream runs. Default 30 s.
	InfoInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before reconnecting after
	// the stream or Info failed. Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
}

func (o *Options) defaults() {
	if o.InfoInterval <= 0 {
		o.InfoInterval = 30 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
}

// Host mirrors one sandboxd. Run keeps the mirror current; Inventory reads
// it. It is safe for concurrent use.
type Host struct {
	client   sandboxdv1connect.SandboxdServiceClient
	endpoint string
	opts     Options

	mu        sync.Mutex
	info      *pb.InfoResponse
	sandboxes map[string]*pb.Sandbox
	synced    bool // a snapshot arrived on the current stream
	lastErr   error
	changed   chan struct{}
	// infoAsked numbers the Info calls as they start, and infoKept is the
	// number of the answer in info: an answer to an earlier call that
	// lands after a later one's is older, and dropped.
	infoAsked, infoKept uint64
	// infoNow asks the stream's Info loop to ask Info at once.
	infoNow chan struct{}
	// ended is why sandboxes that ended by themselves ended, as their
	// Watch deletes said, the newest maxEnded of them.
	ended      map[string]string
	endedOrder []string
}

// maxEnded bounds how many endings the mirror remembers.
const maxEnded = 1024

// New returns a mirror of the sandboxd that client talks to, which the
// fleet reaches at endpoint (the NodeInventory's spec.endpoint).
func New(client sandboxdv1connect.SandboxdServiceClient, endpoint string, opts Options) *Host {
	opts.defaults()
	return &Host{client: client, endpoint: endpoint, opts: opts, changed: make(chan struct{}, 1), infoNow: make(chan struct{}, 1)}
}

// Changed receives after the mirror changed: a sandbox came, went or
// changed, the host's Info changed, or the mirror lost or regained sync.
// Changes between two receives coalesce into one.
func (h *Host) Changed() <-chan struct{} { return h.changed }

func (h *Host) notify() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// Synced reports whether the mirror follows a live stream, and if not why.
func (h *Host) Synced() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.synced && h.info != nil, h.lastErr
}

// Run follows the host until ctx ends: the Watch stream (a snapshot, then
// each change), with Info asked after each snapshot, at each HostChanged and
// every InfoInterval. When
// either fails the mirror is marked out of sync — readers must not trust a
// host they cannot hear — and Run reconnects with capped exponential
// backoff. It returns ctx's error.
func (h *Host) Run(ctx context.Context) error {
	backoff := h.opts.MinBackoff
	for {
		started := time.Now()
		err := h.follow(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h.lose(err)
		if time.Since(started) > h.opts.MaxBackoff {
			backoff = h.opts.MinBackoff // it ran a while: start over
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, h.opts.MaxBackoff)
	}
}

// lose marks the mirror out of sync after err.
func (h *Host) lose(err error) {
	h.mu.Lock()
	h.synced, h.lastErr = false, err
	h.mu.Unlock()
	h.notify()
}

// follow runs one stream until it fails.
func (h *Host) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.client.Watch(ctx, connect.NewRequest(&pb.WatchRequest{}))
	if err != nil {
		return fmt.Errorf("watch %s: %w", h.endpoint, err)
	}
	defer stream.Close()
	infoErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(h.opts.InfoInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-h.infoNow: // the host said Info changed
			}
			if err := h.refreshInfo(ctx); err != nil {
				infoErr <- err
				cancel() // ends Receive below
				return
			}
		}
	}()
	for stream.Receive() {
		m := stream.Msg()
		if m.GetSnapshot() != nil {
			// Info is asked after each snapshot, not before the stream: a
			// change to the host between that answer and the stream's start
			// would be announced to nobody and wait for InfoInterval. sandboxd
			// announces every change after the snapshot (HostChanged).
			if err = h.refreshInfo(ctx); err != nil {
				break
			}
		}
		h.apply(m)
	}
	select {
	case err := <-infoErr: // first: it ends ctx, and with it the calls above
		return err
	default:
	}
	if err != nil {
		return err // the snapshot's Info
	}
	if err := stream.Err(); err != nil {
		return fmt.Errorf("watch %s: %w", h.endpoint, err)
	}
	return fmt.Errorf("watch %s: the stream ended", h.endpoint)
}

// refreshInfo asks Info and keeps the answer, unless an answer to a call
// that started later is already kept (the stream's and the ticker's calls
// overlap).
func (h *Host) refreshInfo(ctx context.Context) error {
	h.mu.Lock()
	h.infoAsked++
	n := h.infoAsked
	h.mu.Unlock()
	resp, err := h.client.Info(ctx, connect.NewRequest(&pb.InfoRequest{}))
	if err != nil {
		return fmt.Errorf("info of %s: %w", h.endpoint, err)
	}
	h.mu.Lock()
	if n > h.infoKept {
		h.info, h.infoKept = resp.Msg, n
	}
	h.mu.Unlock()
	h.notify()
	return nil
}

// apply takes one message of the Watch stream.
func (h *Host) apply(m *pb.WatchResponse) {
	h.mu.Lock()
	switch ev := m.GetEvent().(type) {
	case *pb.WatchResponse_Snapshot_:
		h.sandboxes = make(map[string]*pb.Sandbox, len(ev.Snapshot.GetSandboxes()))
		for _, sb := range ev.Snapshot.GetSandboxes() {
			h.sandboxes[sb.GetId()] = sb
		}
		h.synced, h.lastErr = true, nil
	case *pb.WatchResponse_HostChanged_:
		h.mu.Unlock()
		select {
		case h.infoNow <- struct{}{}:
		default:
		}
		return
	case *pb.WatchResponse_Change_:
		sb := ev.Change.GetSandbox()
		if h.sandboxes == nil {
			h.sandboxes = map[string]*pb.Sandbox{}
		}
		switch ev.Change.GetType() {
		case pb.WatchResponse_CHANGE_TYPE_DELETED:
			delete(h.sandboxes, sb.GetId())
			if why := ev.Change.GetEnded(); why != "" {
				h.rememberEndedLocked(sb.GetId(), why)
			}
		default:
			h.sandboxes[sb.GetId()] = sb
		}
	default:
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	h.notify()
}

// rememberEndedLocked keeps why sandbox id ended, forgetting the oldest
// ending past maxEnded.
func (h *Host) rememberEndedLocked(id, why string) {
	if h.ended == nil {
		h.ended = map[string]string{}
	}
	if _, ok := h.ended[id]; !ok {
		h.endedOrder = append(h.endedOrder, id)
	}
	h.ended[id] = why
	if len(h.endedOrder) > maxEnded {
		delete(h.ended, h.endedOrder[0])
		h.endedOrder = h.endedOrder[1:]
	}
}

// Ended says why sandbox id ended, when it ended by itself (its envd died)
// and its Watch delete said so; "" otherwise, or once forgotten.
func (h *Host) Ended(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended[id]
}

// ErrNotSynced is returned by Inventory while the mirror does not follow a
// live stream.
var ErrNotSynced = errors.New("host mirror is not in sync")

// Inventory is the host's NodeInventory as of now, without publishedAt
// (the publisher stamps it). Sandboxes are sorted by ID and templates by
// name, so equal hosts give equal objects. It fails with ErrNotSynced
// until the first snapshot and whenever the stream is down.
func (h *Host) Inventory() (*v1beta1.NodeInventory, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.synced || h.info == nil {
		if h.lastErr != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotSynced, h.lastErr)
		}
		return nil, ErrNotSynced
	}
	sandboxes := make([]*pb.Sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		sandboxes = append(sandboxes, sb)
	}
	inv := &v1beta1.NodeInventory{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta: metav1.ObjectMeta{Name: h.info.GetNodeName()},
		Spec:       Spec(h.endpoint, h.info, sandboxes),
	}
	return inv, nil
}

// Sandboxes returns copies of the mirrored sandboxes as sandboxd sent them
// (with what the inventory leaves out, such as each sandbox's address),
// sorted by ID. Like Inventory, it fails with ErrNotSynced while the mirror
// does not follow a live stream.
func (h *Host) Sandboxes() ([]*pb.Sandbox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.synced || h.info == nil {
		if h.lastErr != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotSynced, h.lastErr)
		}
		return nil, ErrNotSynced
	}
	out := make([]*pb.Sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		out = append(out, proto.CloneOf(sb))
	}
	slices.SortFunc(out, func(a, b *pb.Sandbox) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return out, nil
}

// Spec is the NodeInventory spec of a host with info and sandboxes.
// Allocation counts the sandboxes themselves, so it agrees with the list
// even between two Info calls.
func Spec(endpoint string, info *pb.InfoResponse, sandboxes []*pb.Sandbox) v1beta1.NodeInventorySpec {
	spec := v1beta1.NodeInventorySpec{
		Endpoint: endpoint,
		Capacity: v1beta1.NodeCapacity{
			CPUMilli:  info.GetCapacity().GetCpuMilli(),
			MemoryMiB: info.GetCapacity().GetMemoryMib(),
			Sandboxes: info.GetMaxSandboxes(),
		},
		CPUAdmission:       v1beta1.CPUReserved,
		EnvdVersion:        info.GetEnvdVersion(),
		DiskPressure:       info.GetDiskPressure(),
		VolumeDiskPressure: info.GetVolumeDiskPressure(),
	}
	if info.GetCpuShared() {
		spec.CPUAdmission = v1beta1.CPUShared
	}
	for _, t := range info.GetTemplates() {
		spec.Templates = append(spec.Templates, v1beta1.TemplateVersion{Name: t.GetName(), Version: t.GetVersion()})
	}
	slices.SortFunc(spec.Templates, func(a, b v1beta1.TemplateVersion) int { return cmp.Compare(a.Name, b.Name) })
	// sandboxd lists them newest first: past the bound, the oldest go.
	for _, sn := range info.GetSnapshots()[:min(len(info.GetSnapshots()), v1beta1.MaxInventorySnapshots)] {
		spec.Snapshots = append(spec.Snapshots, v1beta1.SnapshotEntry{
			ID: sn.GetId(), Team: sn.GetTeam(), Name: sn.GetName(), Tag: sn.GetTag(),
			Memory: sn.GetMemory(), PulledFrom: sn.GetPulledFrom(),
		})
	}
	slices.SortFunc(spec.Snapshots, func(a, b v1beta1.SnapshotEntry) int { return cmp.Compare(a.ID, b.ID) })
	spec.SharedVolumeStore = info.GetSharedVolumeStore()
	if spec.SharedVolumeStore == "" {
		for _, v := range info.GetVolumes() {
			spec.Volumes = append(spec.Volumes, v1beta1.VolumeEntry{ID: v.GetId(), Team: v.GetTeam(), Name: v.GetName()})
		}
		slices.SortFunc(spec.Volumes, func(a, b v1beta1.VolumeEntry) int { return cmp.Compare(a.ID, b.ID) })
		spec.Volumes = spec.Volumes[:min(len(spec.Volumes), v1beta1.MaxInventoryVolumes)]
	}
	pools := map[string]*v1beta1.PoolSummary{}
	for _, sb := range sandboxes {
		e := Entry(sb)
		if e.EnvdVersion == spec.EnvdVersion {
			e.EnvdVersion = "" // the node's
		}
		spec.Sandboxes = append(spec.Sandboxes, e)
		spec.Allocated.CPUMilli += e.CPUMilli
		spec.Allocated.MemoryMiB += e.MemoryMiB
		spec.Allocated.Sandboxes++
		if e.Pool != "" {
			p := pools[e.Pool]
			if p == nil {
				p = &v1beta1.PoolSummary{Pool: e.Pool, Template: e.Template}
				pools[e.Pool] = p
			}
			if e.State == v1beta1.SandboxWarm {
				p.Warm++
			}
		}
	}
	slices.SortFunc(spec.Sandboxes, v1beta1.CompareSandboxIDs)
	for _, p := range pools {
		spec.Pools = append(spec.Pools, *p)
	}
	slices.SortFunc(spec.Pools, func(a, b v1beta1.PoolSummary) int { return cmp.Compare(a.Pool, b.Pool) })
	return spec
}

// Entry is a sandbox as the NodeInventory lists it (Spec leaves out its
// envd version when it is the node's). Its times are to the microsecond
// (v1beta1.NewMicroTime), as the inventory's JSON keeps them: an entry is
// the same whether a reader has it from Kubernetes or straight from here
// (the apiserver's single-host mode).
func Entry(sb *pb.Sandbox) v1beta1.SandboxEntry {
	e := v1beta1.SandboxEntry{
		ID:          sb.GetId(),
		Template:    sb.GetTemplate(),
		State:       State(sb.GetState()),
		Pool:        sb.GetPool(),
		Team:        sb.GetTeam(),
		StartedAt:   v1beta1.NewMicroTime(sb.GetStartedAt().AsTime()),
		CPUMilli:    sb.GetResources().GetCpuMilli(),
		MemoryMiB:   sb.GetResources().GetMemoryMib(),
		DiskMiB:     sb.GetResources().GetDiskMib(),
		EnvdVersion: sb.GetEnvdVersion(),
	}
	if utf8.RuneCountInString(e.EnvdVersion) > v1beta1.MaxEnvdVersionLength {
		// Not a version (sandboxd refuses one since, but a record written
		// before may hold it): the node's stands in, rather than an entry
		// every reader drops and a shard that may not fit.
		e.EnvdVersion = ""
	}
	if sb.GetEndAt() != nil {
		end := v1beta1.NewMicroTime(sb.GetEndAt().AsTime())
		e.EndAt = &end
	}
	if sb.GetPausedAt() != nil {
		at := v1beta1.NewMicroTime(sb.GetPausedAt().AsTime())
		e.PausedAt = &at
	}
	if len(sb.GetMetadata()) > 0 {
		e.Metadata = sb.GetMetadata()
	}
	return e
}

// State maps sandboxd's state onto the inventory's.
func State(s pb.SandboxState) v1beta1.SandboxState {
	switch s {
	case pb.SandboxState_SANDBOX_STATE_PAUSED:
		return v1beta1.SandboxPaused
	case pb.SandboxState_SANDBOX_STATE_WARM:
		return v1beta1.SandboxWarm
	default:
		return v1beta1.SandboxRunning
	}
}
