package fleet

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// UpdateNetwork replaces the outbound rules of a running sandbox of team on
// its host; a paused one is e2bapi.ErrNotFound, as in e2b (it is not among
// the running).
func (b *Backend) UpdateNetwork(ctx context.Context, team, id string, u e2bapi.NetworkUpdate) error {
	l, err := b.locate(ctx, team, id)
	if err != nil {
		return err
	}
	if l.sb.GetState() != sandboxdv1.SandboxState_SANDBOX_STATE_RUNNING {
		return fmt.Errorf("update the network of sandbox %s: %w: it is paused", id, e2bapi.ErrNotFound)
	}
	resp, err := l.client.UpdateNetwork(ctx, connect.NewRequest(&sandboxdv1.UpdateNetworkRequest{
		SandboxId: id, Team: team,
		Egress:              &sandboxdv1.Egress{AllowOut: u.AllowOut, DenyOut: u.DenyOut},
		AllowInternetAccess: u.AllowInternetAccess,
	}))
	if err != nil {
		return classify("update the network of", id, err)
	}
	if sb := resp.Msg.GetSandbox(); sb != nil {
		b.remember(id, team, l.node, toSandbox(l.node, sb, tokens{}))
	}
	return nil
}

// egressOf is the outbound rules p gives a host's create, nil when none.
func egressOf(p e2bapi.CreateParams) *sandboxdv1.Egress {
	if p.AllowOut == nil && p.DenyOut == nil {
		return nil
	}
	return &sandboxdv1.Egress{AllowOut: p.AllowOut, DenyOut: p.DenyOut}
}

// restricted reports whether p asks for anything a warm sandbox, made with
// the internet, without rules and without volumes, does not have.
func restricted(p e2bapi.CreateParams) bool {
	return (p.AllowInternetAccess != nil && !*p.AllowInternetAccess) || egressOf(p) != nil || p.MaskRequestHost != "" || len(p.VolumeMounts) > 0
}
