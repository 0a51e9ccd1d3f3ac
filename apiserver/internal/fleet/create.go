package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/tracing"
)

// errNoTemplate is a host that does not hold the template its inventory
// listed (the inventory lags): placement moves on to another node.
var errNoTemplate = errors.New("host lacks the template")

// errNotHonoured is a host whose sandboxd predates a field the create
// asked for (private traffic, auto-resume) and ignored it: the sandbox it
// started is killed and placement moves on.
var errNotHonoured = errors.New("host's sandboxd does not support the sandbox's settings")

// Create claims a warm sandbox of the template when one can be had, else
// creates one cold on the best of K fresh nodes.
func (b *Backend) Create(ctx context.Context, team string, p e2bapi.CreateParams) (*e2bapi.Sandbox, error) {
	sb, warm, err := b.place(ctx, team, p)
	b.metrics.CreateDone(ctx, warm, err)
	return sb, err
}

// tracer makes the backend's spans: placement, and each claim or create
// it tries on a node.
var tracer = tracing.Tracer("sandbox-apiserver")

// place is Create, under the "placement" span (with a child span for each
// claim or create it tries, "placement.claim" and "placement.create"); its
// bool reports a claimed (warm) sandbox.
func (b *Backend) place(ctx context.Context, team string, p e2bapi.CreateParams) (_ *e2bapi.Sandbox, warm bool, err error) {
	ctx, span := tracer.Start(ctx, "placement", trace.WithAttributes(tracing.TemplateKey.String(p.TemplateID), tracing.TeamKey.String(team)))
	defer tracing.End(span, &err)
	sb, node, warm, err := b.placeOn(ctx, team, p)
	if err == nil {
		span.SetAttributes(tracing.NodeKey.String(node), tracing.SandboxIDKey.String(sb.ID), attribute.Bool("skiff.warm", warm))
	}
	return sb, warm, err
}

// placeOn is place; it also returns the node.
func (b *Backend) placeOn(ctx context.Context, team string, p e2bapi.CreateParams) (*e2bapi.Sandbox, string, bool, error) {
	allowed, err := b.volumeNodes(ctx, team, p)
	if err != nil {
		return nil, "", false, err
	}
	if p.Snapshot != nil {
		sb, node, err := b.createFromSnapshot(ctx, team, p, allowed)
		return sb, node, false, err
	}
	var out *e2bapi.Sandbox
	// A warm sandbox has the internet and no rules: one that must not is
	// always cold.
	if !restricted(p) {
		cand, err := b.placer.Claim(ctx, p.TemplateID, b.claimCandidates(), func(ctx context.Context, c inventory.Candidate) error {
			sb, err := b.claim(ctx, team, p, c)
			out = sb
			return err
		})
		switch {
		case err == nil:
			b.remember(out.ID, team, cand.Node, out)
			return out, cand.Node, true, nil
		case !errors.Is(err, placement.ErrNoWarm):
			return nil, "", false, createError(ctx, err)
		}
	}
	res, err := b.resources(ctx, p.TemplateID)
	if err != nil {
		return nil, "", false, err
	}
	req := placement.Request{Template: p.TemplateID, CPUMilli: res.CPUMilli, MemoryMiB: res.MemoryMiB}
	if allowed != nil {
		req.Exclude = func(node string) bool { return !allowed[node] }
	}
	node, err := b.placer.Place(ctx, req, func(ctx context.Context, n *v1beta1.NodeInventory) (placement.Created, error) {
		sb, err := b.create(ctx, team, p, n, res)
		out = sb
		return createdOf(sb, err)
	})
	if err != nil {
		return nil, "", false, volumeHostError(createError(ctx, err), p, allowed)
	}
	b.remember(out.ID, team, node, out)
	return out, node, false, nil
}

// createdOf is what placement is told of a sandbox a create started (sb,
// unless err), so that it counts the sandbox against its host until the
// host's inventory does.
func createdOf(sb *e2bapi.Sandbox, err error) (placement.Created, error) {
	if err != nil || sb == nil {
		return placement.Created{}, err
	}
	return placement.Created{ID: sb.ID, StartedAt: sb.StartedAt}, nil
}

// volumeHostError says, for a create pinned to the hosts of its volumes
// (allowed) that found no room, which volumes and hosts those were.
func volumeHostError(err error, p e2bapi.CreateParams, allowed map[string]bool) error {
	if allowed == nil || !errors.Is(err, e2bapi.ErrCapacity) {
		return err
	}
	var names []string
	for _, m := range p.VolumeMounts {
		names = append(names, m.Name)
	}
	return &e2bapi.VolumeHostError{Volumes: names, Hosts: slices.Sorted(maps.Keys(allowed)), Err: err}
}

// claim claims candidate c for team. A candidate its node cannot own (an
// ID with another node's tag, see inventory.Owned) is passed over without
// a call: its node would be answering for another's sandbox.
func (b *Backend) claim(ctx context.Context, team string, p e2bapi.CreateParams, c inventory.Candidate) (_ *e2bapi.Sandbox, err error) {
	ctx, span := tracer.Start(ctx, "placement.claim", trace.WithAttributes(tracing.NodeKey.String(c.Node), tracing.SandboxIDKey.String(c.SandboxID)))
	defer tracing.End(span, &err)
	if !inventory.Owns(c.Node, c.SandboxID) {
		return nil, fmt.Errorf("%w: node %s lists warm sandbox %s, which is not its own", placement.ErrClaimConflict, c.Node, c.SandboxID)
	}
	done, ok := b.startClaim(c.SandboxID)
	if !ok {
		return nil, fmt.Errorf("%w: sandbox %s is being or was claimed by this replica", placement.ErrClaimConflict, c.SandboxID)
	}
	defer done()
	client := b.clients(c.Node, c.Endpoint)
	resp, err := client.Claim(ctx, connect.NewRequest(&sandboxdv1.ClaimRequest{
		SandboxId:          c.SandboxID,
		Team:               team,
		Metadata:           p.Metadata,
		EnvVars:            p.EnvVars,
		Timeout:            durationpb.New(p.Timeout),
		AutoPause:          p.AutoPause,
		AutoPauseFilesOnly: p.AutoPause && !p.AutoPauseMemory,
		AutoResume:         p.AutoResume,
		AllowPublicTraffic: p.AllowPublicTraffic,
	}))
	if err != nil {
		switch code := connect.CodeOf(err); {
		case code == connect.CodeFailedPrecondition, code == connect.CodeNotFound:
			b.metrics.ClaimConflict() // another claimer took it first
			return nil, fmt.Errorf("%w: %w", placement.ErrClaimConflict, err)
		case isTransport(err):
			return nil, fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, err)
		case code == connect.CodeInvalidArgument:
			return nil, invalidFrom(err)
		}
		return nil, err
	}
	tok := tokens{envd: resp.Msg.GetEnvdAccessToken(), traffic: resp.Msg.GetTrafficAccessToken()}
	sb, err := b.created(ctx, client, c.Node, p, resp.Msg.GetSandbox(), tok)
	if errors.Is(err, errNotHonoured) {
		return nil, fmt.Errorf("%w: %w", placement.ErrClaimConflict, err)
	}
	return sb, err
}

// create creates a sandbox for team on node n with resources res.
func (b *Backend) create(ctx context.Context, team string, p e2bapi.CreateParams, n *v1beta1.NodeInventory, res Defaults) (_ *e2bapi.Sandbox, err error) {
	ctx, span := tracer.Start(ctx, "placement.create", trace.WithAttributes(tracing.NodeKey.String(n.Name), tracing.TemplateKey.String(p.TemplateID)))
	defer tracing.End(span, &err)
	client := b.clients(n.Name, n.Spec.Endpoint)
	req := createRequest(team, p)
	req.Template = p.TemplateID
	req.Resources = &sandboxdv1.Resources{CpuMilli: res.CPUMilli, MemoryMib: res.MemoryMiB, DiskMib: res.DiskMiB}
	resp, err := client.Create(ctx, connect.NewRequest(req))
	if err != nil {
		switch code := connect.CodeOf(err); {
		case code == connect.CodeResourceExhausted:
			return nil, fmt.Errorf("%w: %w", placement.ErrNodeFull, err)
		case isTransport(err):
			return nil, fmt.Errorf("%w: %w", placement.ErrNodeUnavailable, err)
		case code == connect.CodeNotFound:
			return nil, e2bapi.Invalid("templateID", "template %q does not exist", p.TemplateID)
		case code == connect.CodeInvalidArgument:
			inv := invalidFrom(err)
			if ie := new(e2bapi.InvalidError); errors.As(inv, &ie) && ie.Field == "templateID" {
				// The inventory listed the template; the host disagrees.
				return nil, fmt.Errorf("%w: %w: %w", placement.ErrNodeFull, errNoTemplate, err)
			}
			return nil, inv
		}
		return nil, err
	}
	tok := tokens{envd: resp.Msg.GetEnvdAccessToken(), traffic: resp.Msg.GetTrafficAccessToken()}
	span.SetAttributes(tracing.SandboxIDKey.String(resp.Msg.GetSandbox().GetId()))
	sb, err := b.created(ctx, client, n.Name, p, resp.Msg.GetSandbox(), tok)
	if errors.Is(err, errNotHonoured) {
		return nil, fmt.Errorf("%w: %w", placement.ErrNodeFull, err)
	}
	return sb, err
}

// createRequest is the part of a host's CreateRequest that p and team
// decide, whatever the sandbox starts from.
func createRequest(team string, p e2bapi.CreateParams) *sandboxdv1.CreateRequest {
	return &sandboxdv1.CreateRequest{
		EnvVars:             p.EnvVars,
		Metadata:            p.Metadata,
		Timeout:             durationpb.New(p.Timeout),
		Team:                team,
		AllowInternetAccess: p.AllowInternetAccess,
		AutoPause:           p.AutoPause,
		AutoPauseFilesOnly:  p.AutoPause && !p.AutoPauseMemory,
		AutoResume:          p.AutoResume,
		AllowPublicTraffic:  p.AllowPublicTraffic,
		Egress:              egressOf(p),
		MaskRequestHost:     p.MaskRequestHost,
		VolumeMounts:        volumeMountsOf(p),
	}
}

func volumeMountsOf(p e2bapi.CreateParams) []*sandboxdv1.VolumeMount {
	var out []*sandboxdv1.VolumeMount
	for _, m := range p.VolumeMounts {
		out = append(out, &sandboxdv1.VolumeMount{Name: m.Name, Path: m.Path})
	}
	return out
}

// created converts a host's answer to a create or claim. A sandbox started
// without what p asked for (by a host too old to know private traffic,
// auto-resume, outbound rules or maskRequestHost) is killed, and the answer is errNotHonoured: handing it out
// would leave its ports public, or its pause final.
func (b *Backend) created(ctx context.Context, client sandboxdv1connect.SandboxdServiceClient, node string, p e2bapi.CreateParams,
	sb *sandboxdv1.Sandbox, tok tokens) (*e2bapi.Sandbox, error) {
	if sb == nil || sb.GetId() == "" {
		return nil, fmt.Errorf("node %s answered without a sandbox", node)
	}
	private := p.AllowPublicTraffic != nil && !*p.AllowPublicTraffic
	rules := egressOf(p) != nil && sb.GetEgress() == nil
	if (private && tok.traffic == "") || (p.AutoResume && !sb.GetAutoResume()) || rules || p.MaskRequestHost != sb.GetMaskRequestHost() {
		b.log.WarnContext(ctx, "sandbox host ignored private traffic, auto-resume, outbound rules or maskRequestHost (sandboxd too old); killing the sandbox",
			"node", node, "sandbox", sb.GetId(), "private_traffic", private, "auto_resume", p.AutoResume, "rules", rules)
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		defer cancel()
		if _, err := client.Kill(kctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: sb.GetId()})); err != nil {
			b.log.ErrorContext(ctx, "kill sandbox its host started without its settings", "node", node, "sandbox", sb.GetId(), "error", err)
		}
		return nil, fmt.Errorf("node %s, sandbox %s: %w", node, sb.GetId(), errNotHonoured)
	}
	out := toSandbox(node, sb, tok)
	out.Alias = p.Alias
	out.State = e2bapi.StateRunning
	return out, nil
}

// killTimeout bounds the kill of a sandbox a host started without its
// settings; it runs even when the caller has gone.
const killTimeout = 30 * time.Second

// createError maps the error of a claim or placement to the e2bapi
// categories.
func createError(ctx context.Context, err error) error {
	if ie := new(e2bapi.InvalidError); errors.As(err, &ie) {
		return ie
	}
	switch {
	case errors.Is(err, placement.ErrNoCapacity):
		return fmt.Errorf("%w: %w", e2bapi.ErrCapacity, err)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", e2bapi.ErrPlacementTimeout, err)
	}
	return fmt.Errorf("create sandbox: %w", err)
}
