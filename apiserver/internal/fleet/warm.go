package fleet

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/placement"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Spread is a pool's sandboxes by node, as placement spreads the pool:
// Count is read while a node is chosen, and Add(node, 1) is called as soon
// as one is, before the sandbox starts there (Add(node, -1) if it then
// fails), so that warms of the pool placed at the same time spread too.
type Spread interface {
	Count(node string) int
	Add(node string, n int)
}

// Warm starts a warm sandbox of template for pool (namespace/name) on a
// node that placement picks: one that holds the template and has room,
// the one with the fewest of the pool's sandboxes first (spread, which may
// be nil). Non-zero fields of override win over the template's resources.
// It returns the node and the new sandbox's ID; with no node able to take
// it, an error wrapping placement.ErrNoCapacity.
func (b *Backend) Warm(ctx context.Context, template, pool string, override Defaults, spread Spread) (node, id string, err error) {
	res, err := b.resources(ctx, template)
	if err != nil {
		return "", "", err
	}
	if override.CPUMilli > 0 {
		res.CPUMilli = override.CPUMilli
	}
	if override.MemoryMiB > 0 {
		res.MemoryMiB = override.MemoryMiB
	}
	req := placement.Request{Template: template, CPUMilli: res.CPUMilli, MemoryMiB: res.MemoryMiB}
	if spread != nil {
		req.Spread = spread.Count
	}
	node, err = b.placer.Place(ctx, req, func(ctx context.Context, n *v1beta1.NodeInventory) (_ placement.Created, err error) {
		if spread != nil {
			spread.Add(n.Name, 1)
			defer func() {
				if err != nil {
					spread.Add(n.Name, -1)
				}
			}()
		}
		resp, err := b.clients(n.Name, n.Spec.Endpoint).Warm(ctx, connect.NewRequest(&sandboxdv1.WarmRequest{
			Template:  template,
			Pool:      pool,
			Resources: &sandboxdv1.Resources{CpuMilli: res.CPUMilli, MemoryMib: res.MemoryMiB, DiskMib: res.DiskMiB},
		}))
		if err != nil {
			switch code := connect.CodeOf(err); {
			case code == connect.CodeResourceExhausted, code == connect.CodeNotFound, code == connect.CodeInvalidArgument:
				// Full, or the inventory listed a template the host no
				// longer has: another node may do.
				return placement.Created{}, fmt.Errorf("%w: %w", placement.ErrNodeFull, err)
			case isTransport(err):
				return placement.Created{}, fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, err)
			}
			return placement.Created{}, err
		}
		sb := resp.Msg.GetSandbox()
		if sb.GetId() == "" {
			return placement.Created{}, fmt.Errorf("node %s answered Warm without a sandbox", n.Name)
		}
		id = sb.GetId()
		c := placement.Created{ID: id}
		if sb.GetStartedAt() != nil {
			c.StartedAt = sb.GetStartedAt().AsTime()
		}
		return c, nil
	})
	if err != nil {
		return "", "", fmt.Errorf("warm a sandbox of %s for pool %s: %w", template, pool, err)
	}
	return node, id, nil
}
