// Package placement chooses the host a new sandbox goes to, for the
// apiserver's create: a claim of a warm sandbox when the template has one, else
// a cold create on the best of K hosts sampled from the fleet.
//
// # Cold create: best of K
//
// Place reads the fleet once through an inventory.Source (which serves fresh
// nodes only) and keeps the eligible nodes: those that list the template and
// have room for the request in CPU, memory and sandbox slots, counting what
// the inventory says is allocated plus the creates this Placer has in flight
// there. It samples K eligible nodes uniformly at random (reservoir sampling,
// in one pass, without building the eligible list) and calls create on the one
// with the highest score,
//
//	score = min over cpu, memory, slots of (capacity − allocated − in flight − request) / capacity
//
// that is, the fraction of its tightest resource the node would have left
// after taking the sandbox; a dimension with zero capacity and nothing asked
// of it scores 1. Ties go to a random one of the tied nodes.
//
// Sampling K rather than scanning for the single best node is the "power of K
// choices": each create looks at a handful of nodes, yet load stays close to
// even, and concurrent creates (from this and other apiserver replicas, whose
// inventories lag by a publish interval) spread out instead of all piling on
// the one node that looked emptiest.
//
// The create's resources are held against the node while create runs, so
// concurrent creates see each other. When create succeeds, the sandbox it
// reports (Created) goes on being counted against the node until the node's
// inventory counts it: until the first inventory of the node that lists it,
// or, for a sandbox that ended before any did, the first stamped a second or
// more after the host started it; or a Forget (the caller killed it); or
// Options.MaxHold. Without that, creates in a row between two publishes
// would all see the same inventory and, with K at least the fleet's size,
// all go to the same freest node. A sandbox its caller starts on a node it
// chose rather than through Place (a fork, on its source's node; a create
// from a snapshot, on a node that holds it) is counted the same way through
// Hold; a resume needs no count, since a paused sandbox's host counts it
// already (its inventory lists every sandbox it holds). The times compared
// are both the host's (its publisher's stamp and its sandboxd's start),
// never this process's; but the stamp is in the kube-apiserver's time
// (shared/serverclock), so on a host whose own clock runs more than a
// second behind it the stamp rule can end a count before an inventory
// counts the sandbox: the node is then undercounted for that moment. A
// sandbox placed by another replica is counted once its
// host publishes; until then this Placer can undercount the node. That is
// safe because sandboxd, not placement, has the last word: a host that is full refuses with resource_exhausted, which the
// caller reports as ErrNodeFull, and Place then excludes that node and
// samples again from the same listing, at most MaxAttempts creates in all.
// The same goes for a host that cannot be reached (ErrNodeUnavailable). Any
// other error ends the placement at once. When no eligible node is left,
// Place returns ErrNoCapacity, which the REST API answers with 503
// sandbox_capacity_unavailable.
//
// # Warm claim
//
// Claim takes up to a limit of warm candidates from the Source, spread across
// nodes, and calls claim on each in turn until one succeeds. A claim that lost
// the race for its sandbox (ErrClaimConflict) or whose host cannot be reached
// (ErrNodeUnavailable) moves on to the next candidate; any other error ends the
// claim. With none left, Claim returns ErrNoWarm and the caller falls back to
// Place.
//
// Placement never speaks to sandboxd itself: the caller passes the call to
// make and wraps sandboxd's Connect codes into this package's errors, so that
// this package depends on the inventory alone and its tests need no server.
package placement
