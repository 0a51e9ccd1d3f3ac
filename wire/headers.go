package wire

// Header names on the wire.
const (
	// AccessTokenHeader carries a sandbox's envd access token (e2b's name).
	// envd checks it; sandboxd's relay checks it before waking a paused
	// sandbox; the proxy routes old SDKs' /files calls by it.
	AccessTokenHeader = "X-Access-Token"
	// NodeTokenHeader carries the node token a sandboxd host accepts from
	// the apiserver and the proxy, when Authorization is not free (a relayed
	// request keeps the SDK's own).
	NodeTokenHeader = "Skiff-Node-Token"
	// SandboxIDHeader and SandboxPortHeader name a request's sandbox and
	// port when the SDK reaches the proxy at E2B_SANDBOX_URL (e2b's names).
	SandboxIDHeader   = "E2b-Sandbox-Id"
	SandboxPortHeader = "E2b-Sandbox-Port"
)
