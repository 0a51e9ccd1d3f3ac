package placement

import (
	"context"
	"fmt"

	"github.com/skiff-dev/skiff/shared/inventory"
)

// Claim hands the caller a warm sandbox of template: it takes up to limit
// warm candidates from the Source (limit ≤ 0 means DefaultClaimLimit), spread
// across nodes, and calls claim on each in turn until one succeeds, returning
// that candidate.
//
// claim should wrap a sandbox that is no longer warm (another claim won it, or
// it is gone) into ErrClaimConflict and an unreachable node into
// ErrNodeUnavailable: those move on to the next candidate. Any other error, or
// one that arrives once ctx is done, is returned at once. With no candidate
// left, Claim returns an error wrapping ErrNoWarm (and the last refusal, if
// any), and the caller falls back to Place.
func (p *Placer) Claim(ctx context.Context, template string, limit int, claim func(context.Context, inventory.Candidate) error) (inventory.Candidate, error) {
	if limit <= 0 {
		limit = DefaultClaimLimit
	}
	if err := ctx.Err(); err != nil {
		return inventory.Candidate{}, fmt.Errorf("claim warm sandbox: %w", err)
	}
	cands, err := p.src.WarmCandidates(ctx, template, limit)
	if err != nil {
		return inventory.Candidate{}, fmt.Errorf("claim warm sandbox: list candidates: %w", err)
	}
	var last error
	for _, c := range cands {
		err := claim(ctx, c)
		if err == nil {
			return c, nil
		}
		wrapped := fmt.Errorf("claim sandbox %s on node %s: %w", c.SandboxID, c.Node, err)
		if ctx.Err() != nil || !p.claimRetryable(err) {
			return inventory.Candidate{}, wrapped
		}
		last = wrapped
	}
	if last == nil {
		return inventory.Candidate{}, fmt.Errorf("%w of template %q", ErrNoWarm, template)
	}
	return inventory.Candidate{}, fmt.Errorf("%w of template %q: %d candidates refused, last: %w", ErrNoWarm, template, len(cands), last)
}
