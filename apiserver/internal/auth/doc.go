// Package auth turns the e2b API key a request carries into the team it
// belongs to, and limits how fast a team may create sandboxes.
//
// A team is a Kubernetes namespace. An API key is "e2b_" followed by 40
// lowercase hex characters (20 random bytes), the shape the e2b SDKs accept
// without E2B_VALIDATE_API_KEY=false. Keys are never stored: both stores hold
// only the SHA-256 digest of each key (see [Hash]) and confirm a match with a
// constant-time comparison.
//
// Two [Store] implementations exist:
//
//   - [SecretStore] reads Secrets labelled skiff.dev/api-key through an
//     informer cache; the team is the Secret's namespace ([CreateKey] documents
//     the Secret's exact shape).
//   - [FileStore] reads a keys file (`team key` per line) for installations
//     without Kubernetes and reloads it when it changes.
//
// [Middleware] authenticates every request it wraps; the caller mounts
// GET /health (and anything else public) outside it. [RateLimiter] is the
// per-team create-rate limit; the per-team sandbox count limit needs sandbox
// counts, so it lives with the caller.
package auth
