package wire

// EnvdInit is the body of envd's POST /init, in e2b's JSON names: what the
// orchestrator (sandboxd) tells a sandbox's envd when it starts, resumes or
// is claimed.
type EnvdInit struct {
	// AccessToken becomes the token envd requires (X-Access-Token); nil
	// keeps the current one, "" removes it. Fields left out keep their
	// values.
	AccessToken    *string           `json:"accessToken,omitempty"`
	EnvVars        map[string]string `json:"envVars,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	// Timestamp is when the caller sent it (RFC 3339); envd checks its
	// form and logs it.
	Timestamp string `json:"timestamp,omitempty"`
}
