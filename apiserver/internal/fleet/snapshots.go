package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// A snapshot lives on the host that took it (its ID carries that host's
// tag, like a sandbox ID), and a sandbox from it starts there. Lists and
// lookups by name ask every fresh host (sandboxd's ListSnapshots): a
// snapshot is visible on every replica the moment its host answers, with
// no inventory lag; the cost is one call per host, fine for fleets of tens
// of hosts.

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
	nodes, err := b.src.ListNodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: list nodes: %w", err)
	}
	return b.snapshotsOn(ctx, nodes, &sandboxdv1.ListSnapshotsRequest{Team: team, SandboxId: f.SourceSandbox, Name: f.Name})
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

// findSnapshot returns the team's snapshot ref names: by ID on the host
// its tag names, by name on every fresh host (the newest, if several
// hosts have one).
func (b *Backend) findSnapshot(ctx context.Context, team string, ref e2bapi.SnapshotRef) (*e2bapi.Snapshot, error) {
	nodes, err := b.src.ListNodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("find snapshot: list nodes: %w", err)
	}
	if ref.ID != "" {
		tag, err := sandboxid.Parse(ref.ID)
		if err != nil {
			return nil, fmt.Errorf("snapshot %q: %w", ref.ID, e2bapi.ErrNotFound)
		}
		nodes = slices.DeleteFunc(nodes, func(n v1beta1.NodeInventory) bool { return sandboxid.NodeTag(n.Name) != tag })
	}
	found, err := b.snapshotsOn(ctx, nodes, &sandboxdv1.ListSnapshotsRequest{Team: team, Name: ref.String()})
	if err != nil {
		return nil, err
	}
	var best *e2bapi.Snapshot
	for i := range found {
		s := &found[i]
		if ref.ID != "" && s.ID != ref.ID || ref.ID == "" && (s.Name != ref.Name || s.Tag != ref.Tag) {
			continue
		}
		if best == nil || s.CreatedAt.After(best.CreatedAt) {
			best = s
		}
	}
	if best == nil {
		return nil, fmt.Errorf("snapshot %s: %w", ref, e2bapi.ErrNotFound)
	}
	return best, nil
}

// DeleteSnapshot deletes the team's snapshot ref names, on its host.
func (b *Backend) DeleteSnapshot(ctx context.Context, team string, ref e2bapi.SnapshotRef) error {
	s, err := b.findSnapshot(ctx, team, ref)
	if err != nil {
		return err
	}
	client, err := b.nodeClient(ctx, s.Node)
	if err != nil {
		return err
	}
	if _, err := client.DeleteSnapshot(ctx, connect.NewRequest(&sandboxdv1.DeleteSnapshotRequest{Snapshot: s.ID, Team: team})); err != nil {
		return snapshotError("delete snapshot", s.ID, err)
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

// createFromSnapshot starts a sandbox of team from snapshot s, on the host
// that holds it.
func (b *Backend) createFromSnapshot(ctx context.Context, team string, p e2bapi.CreateParams) (*e2bapi.Sandbox, error) {
	s := p.Snapshot
	client, err := b.nodeClient(ctx, s.Node)
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
	sb, err := b.created(ctx, client, s.Node, p, resp.Msg.GetSandbox(), tok)
	if err != nil {
		return nil, err
	}
	b.remember(sb.ID, team, s.Node, sb)
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
		out[i].Sandbox = sb
	}
	return out, nil
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
		CreatedAt: s.GetCreatedAt().AsTime(), SizeBytes: s.GetSizeBytes(), Node: node,
	}
}
