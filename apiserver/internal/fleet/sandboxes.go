package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/shared/inventory"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// located is a sandbox found on its host.
type located struct {
	node   string
	client sandboxdv1connect.SandboxdServiceClient
	sb     *sandboxdv1.Sandbox
	tokens tokens
}

// tokens are a sandbox's secrets, which sandboxd returns only from create,
// claim and Get, never in a Sandbox (the inventory publishes those).
type tokens struct {
	envd    string // X-Access-Token, for envd
	traffic string // e2b-traffic-access-token, for its other ports; empty when public
}

// locate finds sandbox id of team: on the fresh nodes whose tag the ID
// carries, those whose inventory lists it (or that this replica just wrote
// it on) first. sandboxd's answer is authoritative: a sandbox of another
// team, or a warm one, is ErrNotFound. No node outside the source is ever
// called.
func (b *Backend) locate(ctx context.Context, team, id string) (*located, error) {
	tag, err := sandboxid.Parse(id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, e2bapi.ErrNotFound)
	}
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("find sandbox %s: list nodes: %w", id, err)
	}
	recent := b.recentNode(id)
	type target struct{ name, endpoint string }
	var first, rest []target
	for i := range nodes {
		n := &nodes[i]
		if sandboxid.NodeTag(n.Name) != tag {
			continue
		}
		t := target{n.Name, n.Spec.Endpoint}
		listed := n.Name == recent
		for j := range n.Spec.Sandboxes {
			if n.Spec.Sandboxes[j].ID == id {
				listed = true
				break
			}
		}
		if listed {
			first = append(first, t)
		} else {
			rest = append(rest, t)
		}
	}
	var unreachable error
	for _, t := range append(first, rest...) {
		c := b.clients(t.name, t.endpoint)
		resp, err := c.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: id}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound {
				continue
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("get sandbox %s on node %s: %w", id, t.name, err)
			}
			if !isTransport(err) {
				b.log.WarnContext(ctx, "sandbox host failed a get", "node", t.name, "sandbox", id, "error", err)
				unreachable = fmt.Errorf("get sandbox %s on node %s: %w", id, t.name, err)
				continue
			}
			b.hostUnreachable(ctx, t.name, err)
			unreachable = fmt.Errorf("get sandbox %s on node %s: %w: %w", id, t.name, e2bapi.ErrUnavailable, err)
			continue
		}
		b.hostAnswered(ctx, t.name)
		sb := resp.Msg.GetSandbox()
		if sb == nil || sb.GetTeam() != team || sb.GetState() == sandboxdv1.SandboxState_SANDBOX_STATE_WARM {
			return nil, fmt.Errorf("sandbox %s: %w", id, e2bapi.ErrNotFound)
		}
		return &located{node: t.name, client: c, sb: sb, tokens: tokens{
			envd: resp.Msg.GetEnvdAccessToken(), traffic: resp.Msg.GetTrafficAccessToken(),
		}}, nil
	}
	if unreachable != nil {
		return nil, unreachable
	}
	return nil, fmt.Errorf("sandbox %s: %w", id, e2bapi.ErrNotFound)
}

// Get returns one sandbox of team, from its host; while the host does not
// answer (and is not yet stale), the last record its inventory published.
func (b *Backend) Get(ctx context.Context, team, id string) (*e2bapi.Sandbox, error) {
	l, err := b.locate(ctx, team, id)
	if errors.Is(err, e2bapi.ErrUnavailable) {
		if sb := b.lastKnown(ctx, team, id); sb != nil {
			return sb, nil
		}
	}
	if err != nil {
		return nil, err
	}
	// As e2b's GET, with the envd token (the traffic token never).
	sb := toSandbox(l.node, l.sb, tokens{envd: l.tokens.envd})
	return sb, nil
}

// Kill removes a sandbox of team.
func (b *Backend) Kill(ctx context.Context, team, id string) error {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return err
	}
	return b.kill(ctx, team, id, l)
}

// kill removes l, a sandbox of team.
func (b *Backend) kill(ctx context.Context, team, id string, l *located) error {
	if _, err := l.client.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
		return classify("kill", id, err)
	}
	b.remember(id, team, l.node, nil)
	b.placer.Forget(id)
	return nil
}

// SetTimeout sets the end of a sandbox of team to now + timeout, or with
// onlyExtend to the later of that and its current end. A timeout of 0
// without onlyExtend ends it now, as e2b's API does (it sets the
// end to now): killed, or paused with auto-pause.
func (b *Backend) SetTimeout(ctx context.Context, team, id string, timeout time.Duration, onlyExtend bool) error {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return err
	}
	if l.sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		// As e2b's API: only a running sandbox has a deadline, and its
		// store of running sandboxes has no other.
		return fmt.Errorf("set timeout of sandbox %s: %w: it is paused", id, e2bapi.ErrNotFound)
	}
	if timeout <= 0 && !onlyExtend {
		err = b.endNow(ctx, team, id, l)
	} else {
		_, err = b.setTimeout(ctx, l, id, timeout, onlyExtend)
	}
	if errors.Is(err, e2bapi.ErrConflict) {
		// The deadline's and the pause's one refusal: the sandbox was
		// paused meanwhile.
		return fmt.Errorf("set timeout of sandbox %s: %w: it was paused", id, e2bapi.ErrNotFound)
	}
	return err
}

// endNow ends l, a running sandbox of team, at once, as its deadline
// would: killed, or paused with auto-pause (keeping its memory unless it
// was created with autoPauseMemory: false). Not by a deadline of now at
// sandboxd (its shortest timeout): that would also become the sandbox's
// last timeout, which an auto-resume gives it, so traffic would wake it
// only to pause it again.
func (b *Backend) endNow(ctx context.Context, team, id string, l *located) error {
	if l.sb.GetAutoPause() {
		return b.pause(ctx, team, id, l, !l.sb.GetAutoPauseFilesOnly())
	}
	return b.kill(ctx, team, id, l)
}

// setTimeout moves l's end to now + timeout (unless onlyExtend and it
// ends later already), no later than its last start + MaxLifetime, and
// returns the sandbox as it is after. A timeout
// of 0 is never sent: sandboxd refuses it, and with onlyExtend it changes
// nothing (sent on as the end now, it would end a sandbox whose end is
// unknown here, or past by this replica's clock, which sandboxd's may not
// share).
func (b *Backend) setTimeout(ctx context.Context, l *located, id string, timeout time.Duration, onlyExtend bool) (*sandboxdv1.Sandbox, error) {
	if timeout <= 0 {
		return l.sb, nil
	}
	if onlyExtend && l.sb.GetEndAt() != nil && !l.sb.GetEndAt().AsTime().Before(b.now().Add(timeout)) {
		return l.sb, nil
	}
	req := &sandboxdv1.SetTimeoutRequest{SandboxId: id, Timeout: durationpb.New(timeout), OnlyExtend: onlyExtend}
	if b.maxLife > 0 {
		req.MaxLifetime = durationpb.New(b.maxLife)
	}
	resp, err := l.client.SetTimeout(ctx, connect.NewRequest(req))
	if connect.CodeOf(err) == connect.CodeOutOfRange {
		return nil, e2bapi.Invalid("", "Max instance length exceeded") // e2b's words
	}
	if err != nil {
		return nil, classify("set timeout of", id, err)
	}
	sb := resp.Msg.GetSandbox()
	if sb == nil {
		sb = l.sb
	}
	b.remember(id, sb.GetTeam(), l.node, toSandbox(l.node, sb, tokens{}))
	return sb, nil
}

// Connect resumes a paused sandbox of team with its end at now + timeout,
// or extends a running one to at least now + timeout. A timeout of 0
// leaves a running sandbox's end as it is, and cannot resume a paused one
// (*e2bapi.InvalidError).
func (b *Backend) Connect(ctx context.Context, team, id string, timeout time.Duration, reboot bool) (*e2bapi.Sandbox, bool, error) {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return nil, false, err
	}
	if l.sb.GetState() == sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		if timeout <= 0 {
			return nil, false, e2bapi.Invalid("timeout", "must be greater than 0 to resume a paused sandbox")
		}
		resp, err := l.client.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: id, Timeout: durationpb.New(timeout), Reboot: reboot}))
		switch {
		case err == nil:
			sb := resp.Msg.GetSandbox()
			if sb == nil {
				sb = l.sb
			}
			out := toSandbox(l.node, sb, l.tokens)
			out.State = e2bapi.StateRunning
			b.remember(id, team, l.node, out)
			return out, true, nil
		case connect.CodeOf(err) == connect.CodeFailedPrecondition:
			// Someone resumed it first: it runs now, so extend it.
			if l, err = b.locate(ctx, team, id); err != nil {
				return nil, false, err
			}
			if l.sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
				return nil, false, fmt.Errorf("connect sandbox %s: %w: it is neither paused nor running", id, e2bapi.ErrConflict)
			}
		default:
			return nil, false, classify("resume", id, err)
		}
	}
	sb, err := b.setTimeout(ctx, l, id, timeout, true)
	if err != nil {
		return nil, false, err
	}
	return toSandbox(l.node, sb, l.tokens), false, nil
}

// Pause pauses a running sandbox of team; ErrConflict only if it is paused
// now. sandboxd's other refusals (a gVisor sandbox whose files would not
// fit in its memory, …) are *e2bapi.InvalidError with sandboxd's reason,
// and one because the sandbox ended meanwhile is ErrNotFound: a 409 would
// tell the SDK it is paused (its pause() returns false) while it runs on,
// or is gone.
func (b *Backend) Pause(ctx context.Context, team, id string, keepMemory bool) error {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return err
	}
	return b.pause(ctx, team, id, l, keepMemory)
}

// pause pauses l, a sandbox of team, as Pause does.
func (b *Backend) pause(ctx context.Context, team, id string, l *located, keepMemory bool) error {
	if l.sb.GetState() == sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		return fmt.Errorf("pause sandbox %s: %w: already paused", id, e2bapi.ErrConflict)
	}
	resp, err := l.client.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: id, FilesOnly: !keepMemory}))
	if err != nil {
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			return classify("pause", id, err)
		}
		// A refusal does not say what the sandbox is now: paused by
		// another call, killed, or running on (what it could not do).
		now, lerr := b.locate(ctx, team, id)
		switch {
		case lerr != nil:
			return lerr
		case now.sb.GetState() == sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED:
			return fmt.Errorf("pause sandbox %s: %w: already paused", id, e2bapi.ErrConflict)
		}
		reason := err.Error()
		if ce := new(connect.Error); errors.As(err, &ce) {
			reason = ce.Message()
		}
		return e2bapi.Invalid("", "%s", reason)
	}
	sb := resp.Msg.GetSandbox()
	if sb == nil {
		sb = l.sb
	}
	out := toSandbox(l.node, sb, tokens{})
	out.State = e2bapi.StatePaused
	b.remember(id, team, l.node, out)
	return nil
}

// Metrics returns the resource samples of a sandbox of team.
func (b *Backend) Metrics(ctx context.Context, team, id string) ([]e2bapi.Metric, error) {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return nil, err
	}
	resp, err := l.client.Metrics(ctx, connect.NewRequest(&sandboxdv1.MetricsRequest{SandboxId: id}))
	if err != nil {
		return nil, classify("metrics of", id, err)
	}
	out := make([]e2bapi.Metric, 0, len(resp.Msg.GetMetrics()))
	for _, m := range resp.Msg.GetMetrics() {
		out = append(out, e2bapi.Metric{
			Timestamp:  m.GetTimestamp().AsTime(),
			CPUCount:   m.GetCpuCount(),
			CPUUsedPct: m.GetCpuUsedPct(),
			MemUsed:    m.GetMemUsed(),
			MemTotal:   m.GetMemTotal(),
			DiskUsed:   m.GetDiskUsed(),
			DiskTotal:  m.GetDiskTotal(),
		})
	}
	return out, nil
}

// Logs returns the log lines of a sandbox of team that q asks for.
func (b *Backend) Logs(ctx context.Context, team, id string, q e2bapi.LogQuery) ([]e2bapi.LogEntry, error) {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return nil, err
	}
	req := &sandboxdv1.LogsRequest{SandboxId: id, Limit: int32(min(max(q.Limit, 0), math.MaxInt32)), Forward: q.Forward, MinLevel: q.MinLevel, Search: q.Search}
	if !q.Start.IsZero() {
		req.Start = timestamppb.New(q.Start)
	}
	if !q.End.IsZero() {
		req.End = timestamppb.New(q.End)
	}
	resp, err := l.client.Logs(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, classify("logs of", id, err)
	}
	out := make([]e2bapi.LogEntry, 0, len(resp.Msg.GetLogs()))
	for _, e := range resp.Msg.GetLogs() {
		out = append(out, e2bapi.LogEntry{Timestamp: e.GetTimestamp().AsTime(), Line: e.GetLine(), Level: e.GetLevel(), Source: e.GetSource()})
	}
	return out, nil
}

// toSandbox converts sandboxd's view of a sandbox on node, with the tokens
// the caller may see.
func toSandbox(node string, sb *sandboxdv1.Sandbox, tok tokens) *e2bapi.Sandbox {
	out := &e2bapi.Sandbox{
		ID:                 sb.GetId(),
		TemplateID:         sb.GetTemplate(),
		Node:               node,
		State:              toState(sb.GetState()),
		EnvdVersion:        sb.GetEnvdVersion(),
		EnvdAccessToken:    tok.envd,
		TrafficAccessToken: tok.traffic,
		CPUMilli:           sb.GetResources().GetCpuMilli(),
		MemoryMB:           sb.GetResources().GetMemoryMib(),
		DiskMB:             sb.GetResources().GetDiskMib(),
		Metadata:           sb.GetMetadata(),
		AutoPause:          sb.GetAutoPause(),
		AutoResume:         sb.GetAutoResume(),
	}
	if sb.GetStartedAt() != nil {
		out.StartedAt = microseconds(sb.GetStartedAt().AsTime())
	}
	if sb.GetEndAt() != nil {
		out.EndAt = microseconds(sb.GetEndAt().AsTime())
	}
	if out.State == e2bapi.StatePaused && sb.GetPausedAt() != nil {
		// e2b's end of a paused sandbox is when it paused.
		out.EndAt = microseconds(sb.GetPausedAt().AsTime())
	}
	allow, public := sb.GetAllowInternetAccess(), sb.GetAllowPublicTraffic()
	out.AllowInternetAccess, out.AllowPublicTraffic = &allow, &public
	if e := sb.GetEgress(); e != nil {
		out.AllowOut, out.DenyOut = e.GetAllowOut(), e.GetDenyOut()
	}
	out.MaskRequestHost = sb.GetMaskRequestHost()
	for _, m := range sb.GetVolumeMounts() {
		out.VolumeMounts = append(out.VolumeMounts, e2bapi.VolumeMount{Name: m.GetName(), Path: m.GetPath()})
	}
	return out
}

func toState(s sandboxdv1.SandboxState) e2bapi.State {
	if s == sandboxdv1.SandboxState_SANDBOX_STATE_PAUSED {
		return e2bapi.StatePaused
	}
	return e2bapi.StateRunning
}

// isTransport reports whether err is a failure to reach a host rather than
// its answer.
func isTransport(err error) bool {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return true
	}
	switch ce.Code() {
	case connect.CodeUnavailable, connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeUnimplemented:
		return true
	}
	return false
}

// KillOnNode kills sandbox id on node, whoever owns it: a warm sandbox,
// which no team does, or one the caller has already authorised (the
// aggregated API's delete, which RBAC allowed in the sandbox's namespace).
// A node the fleet does not show fresh, or that no longer has the sandbox,
// is e2bapi.ErrNotFound.
func (b *Backend) KillOnNode(ctx context.Context, node, id string) error {
	if !inventory.Owns(node, id) {
		return fmt.Errorf("sandbox %s on node %s: %w", id, node, e2bapi.ErrNotFound)
	}
	n, err := b.src.NodeInventory(ctx, node)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("sandbox %s on node %s: %w", id, node, e2bapi.ErrNotFound)
		}
		return fmt.Errorf("find node %s: %w", node, err)
	}
	if _, err := b.clients(node, n.Spec.Endpoint).Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: id})); err != nil {
		return classify("kill", id, err)
	}
	b.placer.Forget(id)
	return nil
}

// lastKnown returns team's sandbox id as its node's fresh inventory last
// listed it, or nil.
func (b *Backend) lastKnown(ctx context.Context, team, id string) *e2bapi.Sandbox {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil
	}
	for i := range nodes {
		n := &nodes[i]
		if !inventory.Owns(n.Name, id) {
			continue
		}
		for j := range n.Spec.Sandboxes {
			if e := &n.Spec.Sandboxes[j]; e.ID == id && e.Team == team && e.State != v1beta1.SandboxWarm {
				sb := fromEntry(n, e)
				return &sb
			}
		}
	}
	return nil
}

// unreachableLogEvery bounds how often one host's silence is logged.
const unreachableLogEvery = time.Minute

// hostUnreachable logs that node did not answer: once when it stops, then
// at most every unreachableLogEvery, not once per request.
func (b *Backend) hostUnreachable(ctx context.Context, node string, err error) {
	b.mu.Lock()
	last, seen := b.unreachable[node]
	now := b.now()
	if seen && now.Sub(last) < unreachableLogEvery {
		b.mu.Unlock()
		return
	}
	b.unreachable[node] = now
	b.mu.Unlock()
	b.log.WarnContext(ctx, "sandbox host does not answer; its sandboxes answer 503 (GET: the last published record) until it answers or turns stale",
		"node", node, "error", err)
}

// hostAnswered notes that node answers again.
func (b *Backend) hostAnswered(ctx context.Context, node string) {
	b.mu.Lock()
	_, was := b.unreachable[node]
	delete(b.unreachable, node)
	b.mu.Unlock()
	if was {
		b.log.InfoContext(ctx, "sandbox host answers again", "node", node)
	}
}
