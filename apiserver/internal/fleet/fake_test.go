package fleet_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// t0 is the fake clock's time.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeNode is an in-memory sandboxd. Methods the Backend must not call are
// left to the embedded nil interface (and panic).
type fakeNode struct {
	sandboxdv1connect.SandboxdServiceClient

	name      string
	templates []string
	mu        sync.Mutex
	sandboxes map[string]*sandboxdv1.Sandbox
	tokens    map[string]string
	calls     []string
	// full refuses creates with resource_exhausted; down refuses every call
	// with unavailable; claimed refuses claims of these IDs as lost races.
	full, down bool
	// volumesFull is the host's volume store below its disk reserve: it
	// says so in its inventory and refuses new volumes.
	volumesFull bool
	// volumes are the names of the volumes made here (their IDs "vol-"
	// and the name).
	volumes []string
	// addr, if set, is the node's endpoint: a server of its HTTP routes.
	addr    string
	claimed map[string]bool
	// lastLogs is the last Logs request.
	lastLogs *sandboxdv1.LogsRequest
	// traffic holds the traffic tokens of private sandboxes; old makes the
	// node a sandboxd from before private traffic and auto-resume, which
	// ignores both.
	traffic map[string]string
	old     bool
	// frac is added to t0 as a sandbox's start, for sandboxd's clock,
	// which is not in whole seconds (nor microseconds).
	frac time.Duration
	// refusePause, when set, answers Pause in its place, with the node
	// locked: it may change the sandboxes, as a call in between would.
	refusePause func(n *fakeNode, id string) error
	// pausedFilesOnly is the files_only of the last Pause.
	pausedFilesOnly bool
	// refuseSetTimeout, when set, answers SetTimeout in its place.
	refuseSetTimeout error
	// lastSetTimeout is the last SetTimeout request.
	lastSetTimeout *sandboxdv1.SetTimeoutRequest
	// snapshots are the snapshots this node holds, by ID, as the template
	// and resources a create from one starts a sandbox with (its source's,
	// as sandboxd's).
	snapshots map[string]*sandboxdv1.CreateRequest
}

func newFakeNode(name string, templates ...string) *fakeNode {
	return &fakeNode{name: name, templates: templates, sandboxes: map[string]*sandboxdv1.Sandbox{}, tokens: map[string]string{}, claimed: map[string]bool{},
		traffic: map[string]string{}}
}

func (n *fakeNode) endpoint() string { return cmp.Or(n.addr, n.name+":27777") }

func (n *fakeNode) record(op string) error {
	n.calls = append(n.calls, op)
	if n.down {
		return connect.NewError(connect.CodeUnavailable, errors.New("down"))
	}
	return nil
}

// addWarm adds a warm sandbox of template and returns its ID.
func (n *fakeNode) addWarm(t *testing.T, template string) string {
	t.Helper()
	id, err := sandboxid.New(sandboxid.NodeTag(n.name))
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sandboxes[id] = &sandboxdv1.Sandbox{Id: id, Template: template, State: sandboxdv1.SandboxState_SANDBOX_STATE_WARM, Pool: "team/" + template, EnvdVersion: "0.2.0"}
	return id
}

func (n *fakeNode) notFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s not found", id))
}

func (n *fakeNode) Create(_ context.Context, req *connect.Request[sandboxdv1.CreateRequest]) (*connect.Response[sandboxdv1.CreateResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Create"); err != nil {
		return nil, err
	}
	m := req.Msg
	if n.full {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("no room"))
	}
	if id := m.GetSnapshot(); id != "" {
		snap, ok := n.snapshots[id]
		if !ok {
			return nil, n.notFound(id)
		}
		m = proto.CloneOf(m)
		m.Template, m.Resources = snap.GetTemplate(), snap.GetResources()
	}
	if !slices.Contains(n.templates, m.GetTemplate()) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("template: this host has no template %q", m.GetTemplate()))
	}
	if len(m.GetMetadata()) > 8 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("metadata: at most 8 entries; timeout: required"))
	}
	id, err := sandboxid.New(sandboxid.NodeTag(n.name))
	if err != nil {
		return nil, err
	}
	sb := &sandboxdv1.Sandbox{
		Id: id, Template: m.GetTemplate(), State: sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING, Team: m.GetTeam(),
		Metadata: m.GetMetadata(), StartedAt: timestamppb.New(t0.Add(n.frac)), EndAt: timestamppb.New(t0.Add(n.frac + m.GetTimeout().AsDuration())),
		Resources: m.GetResources(), EnvdVersion: "0.2.0", AutoPause: m.GetAutoPause(), AutoPauseFilesOnly: m.GetAutoPauseFilesOnly(),
		AllowInternetAccess: m.AllowInternetAccess == nil || m.GetAllowInternetAccess(),
	}
	n.sandboxes[id] = sb
	n.tokens[id] = "token-" + id
	n.setTraffic(sb, m.GetAutoResume(), m.AllowPublicTraffic)
	if !n.old {
		sb.Egress, sb.MaskRequestHost = m.GetEgress(), m.GetMaskRequestHost()
	}
	return connect.NewResponse(&sandboxdv1.CreateResponse{Sandbox: proto.CloneOf(sb), EnvdAccessToken: n.tokens[id], TrafficAccessToken: n.traffic[id]}), nil
}

// Fork starts count copies of a running sandbox on this node.
func (n *fakeNode) Fork(_ context.Context, req *connect.Request[sandboxdv1.ForkRequest]) (*connect.Response[sandboxdv1.ForkResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Fork"); err != nil {
		return nil, err
	}
	src := n.sandboxes[req.Msg.GetSandboxId()]
	if src == nil || src.GetTeam() != req.Msg.GetTeam() {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	resp := &sandboxdv1.ForkResponse{}
	for range req.Msg.GetCount() {
		id, err := sandboxid.New(sandboxid.NodeTag(n.name))
		if err != nil {
			return nil, err
		}
		sb := proto.CloneOf(src)
		sb.Id, sb.EndAt = id, timestamppb.New(t0.Add(n.frac+req.Msg.GetTimeout().AsDuration()))
		n.sandboxes[id] = sb
		n.tokens[id] = "token-" + id
		resp.Forks = append(resp.Forks, &sandboxdv1.ForkResult{Created: &sandboxdv1.CreateResponse{Sandbox: proto.CloneOf(sb), EnvdAccessToken: n.tokens[id]}})
	}
	return connect.NewResponse(resp), nil
}

func (n *fakeNode) Claim(_ context.Context, req *connect.Request[sandboxdv1.ClaimRequest]) (*connect.Response[sandboxdv1.ClaimResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Claim"); err != nil {
		return nil, err
	}
	m := req.Msg
	sb, ok := n.sandboxes[m.GetSandboxId()]
	if !ok {
		return nil, n.notFound(m.GetSandboxId())
	}
	if n.claimed[sb.GetId()] || sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_WARM {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not warm"))
	}
	sb.State = sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING
	sb.Team = m.GetTeam()
	sb.Metadata = m.GetMetadata()
	sb.StartedAt = timestamppb.New(t0)
	sb.EndAt = timestamppb.New(t0.Add(m.GetTimeout().AsDuration()))
	sb.AllowInternetAccess = true
	n.tokens[sb.GetId()] = "token-" + sb.GetId()
	n.setTraffic(sb, m.GetAutoResume(), m.AllowPublicTraffic)
	return connect.NewResponse(&sandboxdv1.ClaimResponse{Sandbox: proto.CloneOf(sb), EnvdAccessToken: n.tokens[sb.GetId()], TrafficAccessToken: n.traffic[sb.GetId()]}), nil
}

// setTraffic applies a create's or claim's auto-resume and public traffic,
// as sandboxd does (an old one ignores them).
func (n *fakeNode) setTraffic(sb *sandboxdv1.Sandbox, autoResume bool, public *bool) {
	if n.old {
		return
	}
	sb.AutoResume = autoResume
	sb.AllowPublicTraffic = public == nil || *public
	if !sb.GetAllowPublicTraffic() {
		n.traffic[sb.GetId()] = "traffic-" + sb.GetId()
	}
}

// UpdateNetwork replaces a running sandbox's rules, as sandboxd does.
func (n *fakeNode) UpdateNetwork(_ context.Context, req *connect.Request[sandboxdv1.UpdateNetworkRequest]) (*connect.Response[sandboxdv1.UpdateNetworkResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("UpdateNetwork"); err != nil {
		return nil, err
	}
	m := req.Msg
	sb, ok := n.sandboxes[m.GetSandboxId()]
	if !ok || sb.GetTeam() != m.GetTeam() || sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		return nil, n.notFound(m.GetSandboxId())
	}
	sb.Egress = m.GetEgress()
	if m.AllowInternetAccess != nil {
		sb.AllowInternetAccess = m.GetAllowInternetAccess()
	}
	return connect.NewResponse(&sandboxdv1.UpdateNetworkResponse{Sandbox: proto.CloneOf(sb)}), nil
}

// ListSnapshots answers as a host without snapshots.
func (n *fakeNode) ListSnapshots(context.Context, *connect.Request[sandboxdv1.ListSnapshotsRequest]) (*connect.Response[sandboxdv1.ListSnapshotsResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("ListSnapshots"); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxdv1.ListSnapshotsResponse{}), nil
}

func (n *fakeNode) Get(_ context.Context, req *connect.Request[sandboxdv1.GetRequest]) (*connect.Response[sandboxdv1.GetResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Get"); err != nil {
		return nil, err
	}
	sb, ok := n.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	return connect.NewResponse(&sandboxdv1.GetResponse{Sandbox: proto.CloneOf(sb), EnvdAccessToken: n.tokens[sb.GetId()], TrafficAccessToken: n.traffic[sb.GetId()]}), nil
}

func (n *fakeNode) Kill(_ context.Context, req *connect.Request[sandboxdv1.KillRequest]) (*connect.Response[sandboxdv1.KillResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Kill"); err != nil {
		return nil, err
	}
	if _, ok := n.sandboxes[req.Msg.GetSandboxId()]; !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	delete(n.sandboxes, req.Msg.GetSandboxId())
	return connect.NewResponse(&sandboxdv1.KillResponse{}), nil
}

func (n *fakeNode) SetTimeout(_ context.Context, req *connect.Request[sandboxdv1.SetTimeoutRequest]) (*connect.Response[sandboxdv1.SetTimeoutResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("SetTimeout"); err != nil {
		return nil, err
	}
	n.lastSetTimeout = req.Msg
	if n.refuseSetTimeout != nil {
		return nil, n.refuseSetTimeout
	}
	sb, ok := n.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	// As sandboxd: a timeout must be positive, and only a running sandbox
	// has a deadline.
	d := req.Msg.GetTimeout().AsDuration()
	if d <= 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("timeout: must be positive, got %s", d))
	}
	if sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("only a running sandbox has a deadline"))
	}
	sb.EndAt = timestamppb.New(t0.Add(d))
	return connect.NewResponse(&sandboxdv1.SetTimeoutResponse{Sandbox: proto.CloneOf(sb)}), nil
}

func (n *fakeNode) Pause(_ context.Context, req *connect.Request[sandboxdv1.PauseRequest]) (*connect.Response[sandboxdv1.PauseResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Pause"); err != nil {
		return nil, err
	}
	if n.refusePause != nil {
		return nil, n.refusePause(n, req.Msg.GetSandboxId())
	}
	n.pausedFilesOnly = req.Msg.GetFilesOnly()
	sb, ok := n.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	if sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not running"))
	}
	sb.State = sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED
	sb.PausedAt = timestamppb.New(t0.Add(time.Minute))
	return connect.NewResponse(&sandboxdv1.PauseResponse{Sandbox: proto.CloneOf(sb)}), nil
}

func (n *fakeNode) Resume(_ context.Context, req *connect.Request[sandboxdv1.ResumeRequest]) (*connect.Response[sandboxdv1.ResumeResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Resume"); err != nil {
		return nil, err
	}
	sb, ok := n.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	if sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not paused"))
	}
	sb.State = sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING
	sb.EndAt = timestamppb.New(t0.Add(req.Msg.GetTimeout().AsDuration()))
	return connect.NewResponse(&sandboxdv1.ResumeResponse{Sandbox: proto.CloneOf(sb)}), nil
}

func (n *fakeNode) Metrics(_ context.Context, req *connect.Request[sandboxdv1.MetricsRequest]) (*connect.Response[sandboxdv1.MetricsResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Metrics"); err != nil {
		return nil, err
	}
	if _, ok := n.sandboxes[req.Msg.GetSandboxId()]; !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	return connect.NewResponse(&sandboxdv1.MetricsResponse{Metrics: []*sandboxdv1.SandboxMetric{{Timestamp: timestamppb.New(t0), CpuCount: 2, CpuUsedPct: 12.5, MemUsed: 1 << 20}}}), nil
}

func (n *fakeNode) Logs(_ context.Context, req *connect.Request[sandboxdv1.LogsRequest]) (*connect.Response[sandboxdv1.LogsResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("Logs"); err != nil {
		return nil, err
	}
	if _, ok := n.sandboxes[req.Msg.GetSandboxId()]; !ok {
		return nil, n.notFound(req.Msg.GetSandboxId())
	}
	n.lastLogs = req.Msg
	return connect.NewResponse(&sandboxdv1.LogsResponse{Logs: []*sandboxdv1.LogEntry{{Timestamp: timestamppb.New(t0), Line: "hello", Source: "stdout", Level: "warn"}}}), nil
}

// callCount returns how many calls the node received.
func (n *fakeNode) callCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.calls)
}

// inventory returns the node's inventory as its host would publish it.
func (n *fakeNode) inventory() *v1beta1.NodeInventory {
	n.mu.Lock()
	defer n.mu.Unlock()
	// As vk-sandbox publishes it: shared/hostinventory's Spec of the host's
	// Info and sandboxes.
	info := &sandboxdv1.InfoResponse{
		Capacity:           &sandboxdv1.Resources{CpuMilli: 64_000, MemoryMib: 64 << 10},
		MaxSandboxes:       100,
		EnvdVersion:        "0.2.0",
		VolumeDiskPressure: n.volumesFull,
	}
	for _, t := range n.templates {
		info.Templates = append(info.Templates, &sandboxdv1.TemplateVersion{Name: t, Version: "v1"})
	}
	sbs := make([]*sandboxdv1.Sandbox, 0, len(n.sandboxes))
	for _, id := range slices.Sorted(maps.Keys(n.sandboxes)) {
		sb := proto.CloneOf(n.sandboxes[id])
		if sb.GetResources() == nil {
			sb.Resources = &sandboxdv1.Resources{CpuMilli: 2000, MemoryMib: 512}
		}
		sbs = append(sbs, sb)
	}
	return &v1beta1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: hostinventory.Spec(n.endpoint(), info, sbs)}
}

func (n *fakeNode) GetVolume(_ context.Context, req *connect.Request[sandboxdv1.GetVolumeRequest]) (*connect.Response[sandboxdv1.GetVolumeResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("GetVolume"); err != nil {
		return nil, err
	}
	for _, name := range n.volumes {
		if req.Msg.GetName() == name || req.Msg.GetVolumeId() == "vol-"+name {
			return connect.NewResponse(&sandboxdv1.GetVolumeResponse{Volume: &sandboxdv1.Volume{Id: "vol-" + name, Name: name}}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, errors.New("volume not found"))
}

func (n *fakeNode) CreateVolume(_ context.Context, req *connect.Request[sandboxdv1.CreateVolumeRequest]) (*connect.Response[sandboxdv1.CreateVolumeResponse], error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.record("CreateVolume"); err != nil {
		return nil, err
	}
	if n.volumesFull {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("host is full: volume: this host's disk is nearly full"))
	}
	name := req.Msg.GetName()
	n.volumes = append(n.volumes, name)
	return connect.NewResponse(&sandboxdv1.CreateVolumeResponse{Volume: &sandboxdv1.Volume{Id: "vol-" + name, Name: name}}), nil
}
