package placement

import "errors"

// Errors of placement. The first two are the answers of Place and Claim; the
// others are what callers wrap the errors of their create and claim calls
// into (from sandboxd's Connect codes), so that placement knows which to retry.
var (
	// ErrNoCapacity means no fresh node with the template has room for the
	// sandbox, or every one tried refused it. The REST API answers it with
	// 503 sandbox_capacity_unavailable.
	ErrNoCapacity = errors.New("no node has capacity for the sandbox")
	// ErrNoWarm means no warm sandbox of the template could be claimed; the
	// caller falls back to a cold create.
	ErrNoWarm = errors.New("no warm sandbox to claim")

	// ErrNodeFull is a host's refusal for lack of room (resource_exhausted).
	ErrNodeFull = errors.New("node is full")
	// ErrNodeUnavailable is a host that cannot be reached or does not
	// answer (unavailable).
	ErrNodeUnavailable = errors.New("node is unavailable")
	// ErrClaimConflict is a warm sandbox that is no longer there to claim:
	// another claim won it, or it was killed (failed_precondition,
	// not_found).
	ErrClaimConflict = errors.New("warm sandbox already claimed")
)

// IsRetryable is the default Options.Retryable: a node that is full or
// unavailable is excluded and another one tried.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrNodeFull) || errors.Is(err, ErrNodeUnavailable)
}

// IsClaimRetryable is the default Options.ClaimRetryable: a sandbox claimed by
// someone else, or on a host that cannot be reached, gives way to the next
// candidate.
func IsClaimRetryable(err error) bool {
	return errors.Is(err, ErrClaimConflict) || errors.Is(err, ErrNodeUnavailable)
}
