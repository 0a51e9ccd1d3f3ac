package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/placement"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/shared/tracing"
)

// A snapshot lives on the host that took it (its ID carries that host's
// tag, like a sandbox ID) and on every host that pulled it since, under the
// same ID; each lists it in its NodeInventory. Lists and lookups by name ask
// every fresh host (sandboxd's ListSnapshots) and fold the copies of one
// snapshot into one entry: a snapshot is visible on every replica the
// moment its host answers, with no inventory lag; the cost is one call per
// host, fine for fleets of tens of hosts. A sandbox from a snapshot starts
// on a host that holds it; when every such host is full or gone, a host
// with room pulls it from one that answers (sandboxd to sandboxd, with a
// ticket this replica makes for that snapshot) and starts it there.

// Snapshot captures a sandbox of team on its host.
func (b *Backend) Snapshot(ctx context.Context, team, id, name string) (*e2bapi.Snapshot, error) {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return nil, err
	}
	resp, err := l.client.Snapshot(ctx, connect.NewRequest(&sandboxdv1.SnapshotRequest{SandboxId: id, Team: team, Name: name}))
	if err != nil {
		return nil, snapshotError("snapshot sandbox", id, err)
	}
	return toSnapshot(l.node, resp.Msg.GetSnapshot()), nil
}

// Snapshots lists the team's snapshots on every fresh host.
func (b *Backend) Snapshots(ctx context.Context, team string, f e2bapi.SnapshotFilter) ([]e2bapi.Snapshot, error) {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: list nodes: %w", err)
	}
	found, err := b.snapshotsOn(ctx, nodes, &sandboxdv1.ListSnapshotsRequest{Team: team, SandboxId: f.SourceSandbox, Name: f.Name})
	if err != nil {
		return nil, err
	}
	return mergeCopies(found), nil
}

// mergeCopies folds the copies of one snapshot that several hosts hold
// into one entry, whose Nodes name them all, the host that took it first.
func mergeCopies(found []e2bapi.Snapshot) []e2bapi.Snapshot {
	byID := map[string]int{}
	var out []e2bapi.Snapshot
	for _, s := range found {
		i, ok := byID[s.ID]
		if !ok {
			s.Nodes = []string{s.Node}
			byID[s.ID] = len(out)
			out = append(out, s)
			continue
		}
		m := &out[i]
		if m.PulledFrom != "" && s.PulledFrom == "" {
			// The host that took it: its entry, and first.
			nodes := m.Nodes
			*m = s
			m.Nodes = append([]string{s.Node}, nodes...)
			continue
		}
		m.Nodes = append(m.Nodes, s.Node)
	}
	return out
}

// snapshotsOn asks each of nodes for the snapshots req selects, at once.
// A host that does not answer is logged (once) and left out: its
// snapshots are as unreachable as its sandboxes.
func (b *Backend) snapshotsOn(ctx context.Context, nodes []v1beta1.NodeInventory, req *sandboxdv1.ListSnapshotsRequest) ([]e2bapi.Snapshot, error) {
	var (
		mu   sync.Mutex
		out  []e2bapi.Snapshot
		errs []error
		wg   sync.WaitGroup
	)
	for i := range nodes {
		n := &nodes[i]
		wg.Go(func() {
			resp, err := b.clients(n.Name, n.Spec.Endpoint).ListSnapshots(ctx, connect.NewRequest(req))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				b.hostAnswered(ctx, n.Name)
				for _, s := range resp.Msg.GetSnapshots() {
					out = append(out, *toSnapshot(n.Name, s))
				}
			case connect.CodeOf(err) == connect.CodeUnimplemented:
				// A sandboxd from before snapshots holds none.
			case isTransport(err):
				b.hostUnreachable(ctx, n.Name, err)
			default:
				errs = append(errs, fmt.Errorf("list snapshots on node %s: %w", n.Name, err))
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 && len(out) == 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// findSnapshot returns the team's snapshot ref names, with every fresh
// host that holds it: by ID on the host its tag names and those whose
// inventories list it, by name on every fresh host (the newest, if several
// hosts have one).
func (b *Backend) findSnapshot(ctx context.Context, team string, ref e2bapi.SnapshotRef) (*e2bapi.Snapshot, error) {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("find snapshot: list nodes: %w", err)
	}
	if ref.ID != "" {
		tag, err := sandboxid.Parse(ref.ID)
		if err != nil {
			return nil, fmt.Errorf("snapshot %q: %w", ref.ID, e2bapi.ErrNotFound)
		}
		nodes = slices.DeleteFunc(nodes, func(n v1beta1.NodeInventory) bool {
			return sandboxid.NodeTag(n.Name) != tag && !listsSnapshot(&n, ref.ID)
		})
	}
	found, err := b.snapshotsOn(ctx, nodes, &sandboxdv1.ListSnapshotsRequest{Team: team, Name: ref.String()})
	if err != nil {
		return nil, err
	}
	var best *e2bapi.Snapshot
	for _, s := range mergeCopies(found) {
		if ref.ID != "" && s.ID != ref.ID || ref.ID == "" && (s.Name != ref.Name || s.Tag != ref.Tag) {
			continue
		}
		if best == nil || s.CreatedAt.After(best.CreatedAt) {
			best = &s
		}
	}
	if best == nil {
		return nil, fmt.Errorf("snapshot %s: %w", ref, e2bapi.ErrNotFound)
	}
	return best, nil
}

// listsSnapshot says whether node's inventory lists snapshot id.
func listsSnapshot(n *v1beta1.NodeInventory, id string) bool {
	return slices.ContainsFunc(n.Spec.Snapshots, func(e v1beta1.SnapshotEntry) bool { return e.ID == id })
}

// DeleteSnapshot deletes the team's snapshot ref names on every host that
// holds it. A holder that does not answer keeps its copy, which it lists
// again when it is back (the docs say so); the delete succeeds when one
// holder deleted it.
func (b *Backend) DeleteSnapshot(ctx context.Context, team string, ref e2bapi.SnapshotRef) error {
	s, err := b.findSnapshot(ctx, team, ref)
	if err != nil {
		return err
	}
	var errs []error
	deleted := 0
	for _, node := range s.Nodes {
		client, err := b.nodeClient(ctx, node)
		if err == nil {
			_, err = client.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: s.ID, Team: team}))
		}
		switch {
		case err == nil:
			deleted++
		case connect.CodeOf(err) == connect.CodeNotFound:
			// deleted there meanwhile
		default:
			b.log.WarnContext(ctx, "delete a snapshot's copy", "snapshot", s.ID, "node", node, "error", err)
			errs = append(errs, snapshotError("delete snapshot", s.ID, err))
		}
	}
	if deleted == 0 && len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// nodeClient is the client of a fresh node; ErrUnavailable when it is not
// in the fleet (any more).
func (b *Backend) nodeClient(ctx context.Context, node string) (sandboxdv1connect.SandboxdServiceClient, error) {
	inv, err := b.src.NodeInventory(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w: %w", node, e2bapi.ErrUnavailable, err)
	}
	return b.clients(inv.Name, inv.Spec.Endpoint), nil
}

// createFromSnapshot starts a sandbox of team from snapshot p.Snapshot on
// a host that holds it, trying each until one has room; when none has, or
// none answers, a host with room and the snapshot's template version pulls
// it from a holder that answers, and starts it. It returns the sandbox's
// node.
func (b *Backend) createFromSnapshot(ctx context.Context, team string, p e2bapi.CreateParams, allowed map[string]bool) (*e2bapi.Sandbox, string, error) {
	s := p.Snapshot
	var last error
	for _, node := range s.Nodes {
		if allowed != nil && !allowed[node] {
			continue // not where the sandbox's volumes are
		}
		sb, err := b.createFromSnapshotOn(ctx, team, p, node)
		if err == nil {
			// Started on a node chosen here, not through Place: counted
			// against it as a placed sandbox would be. (The pull below
			// goes through Place, which counts its own.)
			b.hold(node, sb)
			return sb, node, nil
		}
		if !errors.Is(err, e2bapi.ErrCapacity) && !errors.Is(err, e2bapi.ErrUnavailable) {
			return nil, "", err
		}
		last = err
	}
	if b.tokens == nil {
		return nil, "", last
	}
	var out *e2bapi.Sandbox
	res := Defaults{CPUMilli: s.CPUMilli, MemoryMiB: s.MemoryMiB}
	req := placement.Request{Template: s.Template, Version: s.TemplateVersion, CPUMilli: res.CPUMilli, MemoryMiB: res.MemoryMiB,
		Exclude: func(node string) bool { return slices.Contains(s.Nodes, node) || allowed != nil && !allowed[node] }}
	node, err := b.placer.Place(ctx, req, func(ctx context.Context, n *v1beta1.NodeInventory) (placement.Created, error) {
		if err := b.pullTo(ctx, team, s, n); err != nil {
			return placement.Created{}, err
		}
		sb, err := b.createFromSnapshotOn(ctx, team, p, n.Name)
		switch {
		case errors.Is(err, e2bapi.ErrCapacity):
			return placement.Created{}, fmt.Errorf("%w: %w", placement.ErrNodeFull, err)
		case errors.Is(err, e2bapi.ErrUnavailable):
			return placement.Created{}, fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, err)
		}
		out = sb
		return createdOf(sb, err)
	})
	if err != nil {
		if errors.Is(err, placement.ErrNoCapacity) && last != nil {
			return nil, "", fmt.Errorf("%w (and no other host could take it: %w)", last, err)
		}
		return nil, "", volumeHostError(createError(ctx, err), p, allowed)
	}
	return out, node, nil
}

// pullTicketTTL is how long a pull ticket opens its snapshot: each
// request of a pull starts within it.
const pullTicketTTL = 30 * time.Minute

// pullTo makes node n pull snapshot s from one of its holders that
// answers.
func (b *Backend) pullTo(ctx context.Context, team string, s *e2bapi.Snapshot, n *v1beta1.NodeInventory) (err error) {
	ctx, span := tracer.Start(ctx, "placement.pull_snapshot", trace.WithAttributes(tracing.NodeKey.String(n.Name)))
	defer tracing.End(span, &err)
	target := b.clients(n.Name, n.Spec.Endpoint)
	var errs []error
	for _, holder := range s.Nodes {
		inv, err := b.src.NodeInventory(ctx, holder)
		if err != nil {
			errs = append(errs, fmt.Errorf("holder %s: %w", holder, err))
			continue
		}
		began := time.Now()
		resp, err := target.PullSnapshot(ctx, connect.NewRequest(&sandboxdv1.PullSnapshotRequest{
			SnapshotId: s.ID, Team: team, SourceUrl: "http://" + inv.Spec.Endpoint, SourceNode: holder,
			Ticket: nodetoken.PullTicket(b.tokens(holder), s.ID, b.now().Add(pullTicketTTL)),
		}))
		if err == nil {
			b.log.InfoContext(ctx, "snapshot pulled to another host", "snapshot", s.ID, "from", holder, "to", n.Name,
				"fetched_bytes", resp.Msg.GetFetchedBytes(), "duration", time.Since(began))
			return nil
		}
		switch code := connect.CodeOf(err); {
		case isTransport(err):
			return fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, err)
		case code == connect.CodeFailedPrecondition, code == connect.CodeResourceExhausted, code == connect.CodeUnimplemented:
			// This host cannot keep it (another template version, a full
			// disk, no snapshot store): another one may.
			return fmt.Errorf("%w: %w", placement.ErrNodeFull, err)
		}
		errs = append(errs, fmt.Errorf("pull from %s: %w", holder, err))
	}
	return fmt.Errorf("%w: %w: no holder of snapshot %s could be pulled from: %w", placement.ErrNodeUnavailable, e2bapi.ErrUnavailable, s.ID, errors.Join(errs...))
}

// createFromSnapshotOn starts a sandbox of team from snapshot p.Snapshot
// on node, which holds it.
func (b *Backend) createFromSnapshotOn(ctx context.Context, team string, p e2bapi.CreateParams, node string) (*e2bapi.Sandbox, error) {
	s := p.Snapshot
	client, err := b.nodeClient(ctx, node)
	if err != nil {
		return nil, err
	}
	req := createRequest(team, p)
	req.Snapshot = s.ID
	resp, err := client.Create(ctx, connect.NewRequest(req))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			return nil, fmt.Errorf("%w: the host of snapshot %s is full: %w", e2bapi.ErrCapacity, s.ID, err)
		}
		return nil, snapshotError("create from snapshot", s.ID, err)
	}
	tok := tokens{envd: resp.Msg.GetEnvdAccessToken(), traffic: resp.Msg.GetTrafficAccessToken()}
	sb, err := b.created(ctx, client, node, p, resp.Msg.GetSandbox(), tok)
	if err != nil {
		return nil, err
	}
	b.remember(sb.ID, team, node, sb)
	return sb, nil
}

// Fork starts count sandboxes from a sandbox of team, on its host.
func (b *Backend) Fork(ctx context.Context, team, id string, count int, timeout time.Duration) ([]e2bapi.ForkResult, error) {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return nil, err
	}
	resp, err := l.client.Fork(ctx, connect.NewRequest(&sandboxdv1.ForkRequest{
		SandboxId: id, Team: team, Count: int32(count), Timeout: durationpb.New(timeout), //nolint:gosec // count is at most 100
	}))
	if err != nil {
		return nil, snapshotError("fork sandbox", id, err)
	}
	out := make([]e2bapi.ForkResult, len(resp.Msg.GetForks()))
	for i, f := range resp.Msg.GetForks() {
		c := f.GetCreated()
		if c == nil {
			out[i].Err = forkError(f.GetErrorCode(), f.GetErrorMessage())
			continue
		}
		tok := tokens{envd: c.GetEnvdAccessToken(), traffic: c.GetTrafficAccessToken()}
		sb := toSandbox(l.node, c.GetSandbox(), tok)
		sb.State = e2bapi.StateRunning
		b.remember(sb.ID, team, l.node, sb)
		b.hold(l.node, sb)
		out[i].Sandbox = sb
	}
	return out, nil
}

// hold has placement count sb, which its host started on node without
// placement (a fork, a create from a snapshot the node holds), against
// node until the host lists it, as it counts the sandboxes it placed.
func (b *Backend) hold(node string, sb *e2bapi.Sandbox) {
	b.placer.Hold(node, placement.Request{Template: sb.TemplateID, CPUMilli: sb.CPUMilli, MemoryMiB: sb.MemoryMB},
		placement.Created{ID: sb.ID, StartedAt: sb.StartedAt})
}

// forkError is the e2bapi category of one fork's failure on its host.
func forkError(code, message string) error {
	var c connect.Code
	if err := c.UnmarshalText([]byte(code)); err == nil {
		switch c {
		case connect.CodeResourceExhausted:
			return fmt.Errorf("%w: %s", e2bapi.ErrCapacity, message)
		case connect.CodeUnavailable:
			return fmt.Errorf("%w: %s", e2bapi.ErrUnavailable, message)
		}
	}
	return fmt.Errorf("fork: %s: %s", code, message)
}

// snapshotError maps a host's answer to a snapshot call.
func snapshotError(what, id string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("%s %s: %w", what, id, e2bapi.ErrNotFound)
	case connect.CodeFailedPrecondition:
		// sandboxd's words are for the caller (the state, or why the
		// files cannot be copied).
		var ce *connect.Error
		if errors.As(err, &ce) {
			return &e2bapi.ConflictError{Reason: ce.Message()}
		}
		return fmt.Errorf("%s %s: %w: %w", what, id, e2bapi.ErrConflict, err)
	case connect.CodeInvalidArgument:
		return invalidFrom(err)
	case connect.CodeUnimplemented:
		return fmt.Errorf("%s %s: %w: the sandbox's host: %w", what, id, e2bapi.ErrUnsupported, err)
	case connect.CodeResourceExhausted:
		// A host whose disk is nearly full (sandboxd --disk-reserve).
		return fmt.Errorf("%s %s: %w: %w", what, id, e2bapi.ErrCapacity, err)
	}
	if isTransport(err) {
		return fmt.Errorf("%s %s: %w: %w", what, id, e2bapi.ErrUnavailable, err)
	}
	return fmt.Errorf("%s %s: %w", what, id, err)
}

func toSnapshot(node string, s *sandboxdv1.Snapshot) *e2bapi.Snapshot {
	return &e2bapi.Snapshot{
		ID: s.GetId(), Team: s.GetTeam(), Name: s.GetName(), Tag: s.GetTag(),
		SourceSandbox: s.GetSourceSandboxId(), Template: s.GetTemplate(),
		TemplateVersion: s.GetTemplateVersion(), CreatedAt: s.GetCreatedAt().AsTime(), SizeBytes: s.GetSizeBytes(), Node: node,
		PulledFrom: s.GetPulledFrom(), CPUMilli: s.GetResources().GetCpuMilli(), MemoryMiB: s.GetResources().GetMemoryMib(),
	}
}
