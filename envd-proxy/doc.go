// Package envdproxy is the module of sandbox-envd-proxy, the data-plane edge
// that routes e2b SDK traffic (E2B_SANDBOX_URL, or {port}-{id}.{domain}) to
// the sandboxd relay of the host that runs the sandbox.
package envdproxy
