package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// sandboxHandler is a handler for one of the team's sandboxes.
type sandboxHandler func(w http.ResponseWriter, r *http.Request, team, id string)

// shortID is the sandbox ID in raw, as e2b's API reads one (ShortID): old
// SDKs send "<sandboxID>-<clientID>", whose part from the first '-' on is
// dropped; ok is false when what is left is not a sandbox ID.
func shortID(raw string) (id string, ok bool) {
	id, _, _ = strings.Cut(raw, "-")
	return id, validID(id)
}

// sandboxRoute reads {id} (shortID). A malformed ID answers 404, exactly
// like a missing sandbox: the SDKs turn a 404 into SandboxNotFoundError,
// and nothing reaches a host.
func (s *server) sandboxRoute(h sandboxHandler) teamHandler {
	return func(w http.ResponseWriter, r *http.Request, team string) {
		raw := r.PathValue("id")
		id, ok := shortID(raw)
		if !ok {
			writeError(w, http.StatusNotFound, "", "sandbox %s not found", echo(raw))
			return
		}
		h(w, r, team, id)
	}
}

func sandboxSubject(id string) string { return "sandbox " + echo(id) }

// newSandboxBody is e2b's NewSandbox (v1) and NewSandboxV2 (no "secure").
type newSandboxBody struct {
	TemplateID          *string                    `json:"templateID"`
	Timeout             *int64                     `json:"timeout"`
	AutoPause           *bool                      `json:"autoPause"`
	AutoPauseMemory     *bool                      `json:"autoPauseMemory"`
	AutoResume          *autoResumeBody            `json:"autoResume"`
	Secure              *bool                      `json:"secure"`
	AllowInternetAccess *bool                      `json:"allow_internet_access"`
	Network             *networkBody               `json:"network"`
	Metadata            map[string]string          `json:"metadata"`
	EnvVars             map[string]string          `json:"envVars"`
	MCP                 map[string]json.RawMessage `json:"mcp"`
	IAM                 map[string]json.RawMessage `json:"iam"`
	VolumeMounts        []volumeMountJSON          `json:"volumeMounts"`
}

type autoResumeBody struct {
	Enabled *bool `json:"enabled"`
}

// createParams validates a create body: 400s first, then 501s for
// features Skiff does not have. It does not resolve the template.
func (s *server) createParams(b *newSandboxBody, v2 bool) (CreateParams, string, error) {
	var p CreateParams
	if b.TemplateID == nil || strings.TrimSpace(*b.TemplateID) == "" {
		return p, "", required("templateID")
	}
	// Trimmed, as e2b's id.ParseName (the backend ignores a template's
	// case; a snapshot's tag keeps it).
	name := strings.TrimSpace(*b.TemplateID)
	if len(name) > maxTemplateNameLength {
		return p, "", Invalid("templateID", "is longer than %d bytes", maxTemplateNameLength)
	}
	def := defaultTimeoutV1
	if v2 {
		def = defaultTimeoutV2
	}
	timeout, err := seconds("timeout", b.Timeout, def, 1, s.maxTimeout)
	if err != nil {
		return p, "", err
	}
	if err := validateMetadata(b.Metadata); err != nil {
		return p, "", err
	}
	if err := validateEnvVars(b.EnvVars); err != nil {
		return p, "", err
	}
	if err := b.Network.check(); err != nil {
		return p, "", err
	}
	mounts, err := checkVolumeMounts(b.VolumeMounts)
	if err != nil {
		return p, "", err
	}
	// e2b's checks, in its words.
	filesOnly := b.AutoPauseMemory != nil && !*b.AutoPauseMemory
	switch {
	case filesOnly && (b.AutoPause == nil || !*b.AutoPause):
		return p, "", &InvalidError{Reason: "autoPauseMemory=false only applies when autoPause is true."}
	case filesOnly && b.AutoResume != nil && b.AutoResume.Enabled != nil && *b.AutoResume.Enabled:
		return p, "", &InvalidError{Reason: "autoPauseMemory=false (filesystem-only auto-pause) cannot be combined with autoResume: " +
			"a filesystem-only snapshot cannot be auto-resumed by traffic and must be resumed explicitly."}
	case b.Network.publicTraffic() != nil && !*b.Network.publicTraffic() && !v2 && (b.Secure == nil || !*b.Secure):
		return p, "", &InvalidError{Reason: "You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag."}
	}
	if len(b.MCP) > 0 {
		return p, "", unsupported("mcp (the MCP gateway)")
	}
	p = CreateParams{
		Timeout:             timeout,
		Secure:              v2 || (b.Secure != nil && *b.Secure),
		AllowInternetAccess: b.AllowInternetAccess,
		AutoPause:           b.AutoPause != nil && *b.AutoPause,
		AutoPauseMemory:     b.AutoPauseMemory == nil || *b.AutoPauseMemory,
		AutoResume:          b.AutoResume != nil && b.AutoResume.Enabled != nil && *b.AutoResume.Enabled,
		AllowPublicTraffic:  b.Network.publicTraffic(),
		Metadata:            b.Metadata,
		EnvVars:             b.EnvVars,
		VolumeMounts:        mounts,
	}
	if n := b.Network; n != nil {
		p.AllowOut, p.DenyOut = n.AllowOut, n.DenyOut
		if n.MaskRequestHost != nil {
			p.MaskRequestHost = *n.MaskRequestHost
		}
	}
	return p, name, nil
}

// create serves POST /sandboxes (v1: timeout 15 s, a token only with
// "secure") and POST /v2/sandboxes (timeout 300 s, always a token); both
// answer 201 with e2b's Sandbox.
func (s *server) create(v2 bool) teamHandler {
	return func(w http.ResponseWriter, r *http.Request, team string) {
		var body newSandboxBody
		if !decodeBody(w, r, &body) {
			return
		}
		p, name, err := s.createParams(&body, v2)
		if err != nil {
			s.writeBackendError(w, r, err, "")
			return
		}
		tpl, err := s.backend.Template(r.Context(), team, name)
		if errors.Is(err, ErrNotFound) {
			writeTemplateNotFound(w, name)
			return
		}
		if err != nil {
			s.writeBackendError(w, r, err, "template "+echo(name))
			return
		}
		p.TemplateID, p.Snapshot = tpl.ID, tpl.Snapshot
		if name != tpl.ID {
			p.Alias = name
		}
		sb, err := s.backend.Create(r.Context(), team, p)
		if err != nil {
			// A not-found here is the template vanishing between lookup and
			// create: still the caller's templateID.
			if errors.Is(err, ErrNotFound) {
				writeTemplateNotFound(w, name)
				return
			}
			s.writeBackendError(w, r, err, "template "+echo(name))
			return
		}
		sb.Alias = templateAlias(tpl)
		writeJSON(w, http.StatusCreated, s.sandboxJSON(sb))
	}
}

// connectBody is ConnectSandbox (v1: timeout required) and
// ConnectSandboxV2 (all optional), and ResumedSandbox for /resume.
type connectBody struct {
	Timeout *int64 `json:"timeout"`
	// Memory false (the SDK's onResume: 'reboot') boots a paused sandbox
	// afresh on its files instead of restoring what its pause kept.
	Memory *bool `json:"memory"`
	// AutoPause is ResumedSandbox's deprecated flag, accepted and ignored
	// like e2b does.
	AutoPause *bool `json:"autoPause"`
}

// connect serves POST /sandboxes/{id}/connect and its v2 twin: 200 when the
// sandbox was running, 201 when it was resumed. The TTL is only extended:
// as in e2b's API a timeout of 0 leaves a running sandbox's end as it is; it
// cannot resume a paused one (400, from the backend: e2b's would resume it
// to end at once). A negative timeout is a 400, as e2b's OpenAPI
// validation (minimum: 0) answers it.
func (s *server) connect(v2 bool) sandboxHandler {
	return func(w http.ResponseWriter, r *http.Request, team, id string) {
		var body connectBody
		if !decodeBody(w, r, &body) {
			return
		}
		if !v2 && body.Timeout == nil {
			writeInvalid(w, required("timeout"))
			return
		}
		timeout, err := seconds("timeout", body.Timeout, defaultConnectV2, 0, s.maxTimeout)
		if err != nil {
			writeInvalid(w, err)
			return
		}
		reboot := body.Memory != nil && !*body.Memory
		sb, resumed, err := s.backend.Connect(r.Context(), team, id, timeout, reboot)
		if err != nil {
			s.writeBackendError(w, r, err, sandboxSubject(id))
			return
		}
		status := http.StatusOK
		if resumed {
			status = http.StatusCreated
		}
		newAliases(r.Context(), s, team).fill(sb)
		writeJSON(w, status, s.sandboxJSON(sb))
	}
}

// resume serves the deprecated POST /sandboxes/{id}/resume: 201 with the
// Sandbox, 409 when it is running.
func (s *server) resume(w http.ResponseWriter, r *http.Request, team, id string) {
	var body connectBody
	if !decodeBody(w, r, &body) {
		return
	}
	timeout, err := seconds("timeout", body.Timeout, defaultResumeTimeout, 0, s.maxTimeout)
	if err != nil {
		writeInvalid(w, err)
		return
	}
	cur, err := s.backend.Get(r.Context(), team, id)
	if err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	if cur.State != StatePaused {
		writeError(w, http.StatusConflict, "", "sandbox %s is already running", echo(id))
		return
	}
	sb, _, err := s.backend.Connect(r.Context(), team, id, timeout, body.Memory != nil && !*body.Memory)
	if err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	newAliases(r.Context(), s, team).fill(sb)
	writeJSON(w, http.StatusCreated, s.sandboxJSON(sb))
}

// get serves GET /sandboxes/{id} with e2b's SandboxDetail.
func (s *server) get(w http.ResponseWriter, r *http.Request, team, id string) {
	sb, err := s.backend.Get(r.Context(), team, id)
	if err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	newAliases(r.Context(), s, team).fill(sb)
	writeJSON(w, http.StatusOK, s.detailJSON(sb))
}

// kill serves DELETE /sandboxes/{id}: 204, or 404 (the SDK's kill then
// returns false).
func (s *server) kill(w http.ResponseWriter, r *http.Request, team, id string) {
	if err := s.backend.Kill(r.Context(), team, id); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// writeTemplateNotFound answers a create whose template is unknown as e2b
// does: 404 "template 'x' not found".
func writeTemplateNotFound(w http.ResponseWriter, name string) {
	writeError(w, http.StatusNotFound, "", "template '%s' not found", strings.Trim(echo(name), `"`))
}

// setTimeout serves POST /sandboxes/{id}/timeout: end = now + timeout,
// shorter or longer, at most the longest timeout (as e2b's, which cuts
// it). As in e2b's API, a timeout of 0 ends the sandbox now (killed, or
// paused with auto-pause), and a negative one is a 400 (e2b's OpenAPI
// validation: minimum 0).
func (s *server) setTimeout(w http.ResponseWriter, r *http.Request, team, id string) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Timeout == nil {
		writeInvalid(w, required("timeout"))
		return
	}
	if *body.Timeout < 0 {
		writeInvalid(w, Invalid("timeout", "must not be negative, got %d", *body.Timeout))
		return
	}
	// As e2b's: a timeout past the longest a sandbox may live is cut to
	// it, not refused.
	timeout := time.Duration(min(*body.Timeout, int64(s.maxTimeout/time.Second))) * time.Second
	if err := s.backend.SetTimeout(r.Context(), team, id, timeout, false); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type refreshBody struct {
	Duration *int64 `json:"duration"`
}

// refresh serves the legacy keep-alive POST /sandboxes/{id}/refreshes:
// the end moves to now + duration (15 s to 1 h, 15 s if less or none) if
// that is later.
func (s *server) refresh(w http.ResponseWriter, r *http.Request, team, id string) {
	var body refreshBody
	if !decodeBody(w, r, &body) {
		return
	}
	d, err := seconds("duration", body.Duration, defaultRefresh, 0, min(maxRefresh, s.maxTimeout))
	if err != nil {
		writeInvalid(w, err)
		return
	}
	d = max(d, min(defaultRefresh, s.maxTimeout)) // e2b's: at least its default
	if err := s.backend.SetTimeout(r.Context(), team, id, d, true); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type pauseBody struct {
	Memory *bool `json:"memory"`
}

// pause serves POST /sandboxes/{id}/pause: 204, or 409 in e2b's words
// when it is already paused (the SDK's pause then returns false); any
// other refusal is the backend's error (400 with the host's reason, 404
// when the sandbox is gone), so that false means paused.
func (s *server) pause(w http.ResponseWriter, r *http.Request, team, id string) {
	var body pauseBody
	if !decodeBody(w, r, &body) {
		return
	}
	keep := body.Memory == nil || *body.Memory
	if err := s.backend.Pause(r.Context(), team, id, keep); err != nil {
		if errors.Is(err, ErrConflict) {
			writeError(w, http.StatusConflict, "", "Error pausing sandbox - sandbox '%s' is already paused", id)
			return
		}
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// validID reports whether id is a well-formed sandbox ID.
func validID(id string) bool { return sandboxid.Valid(id) }

// networkUpdateBody is e2b's SandboxNetworkUpdateConfig: the outbound
// rules, replaced whole (an omitted list clears), and internet access
// (changed only when sent).
type networkUpdateBody struct {
	AllowOut            []string                   `json:"allowOut"`
	DenyOut             []string                   `json:"denyOut"`
	EgressProxy         map[string]json.RawMessage `json:"egressProxy"`
	Rules               map[string]json.RawMessage `json:"rules"`
	AllowInternetAccess *bool                      `json:"allow_internet_access"`
}

// updateNetwork serves PUT /sandboxes/{id}/network: 204 once new
// connections follow the new rules (open ones go on); the body is checked
// before the sandbox is looked up, as e2b does; a paused sandbox is 404.
func (s *server) updateNetwork(w http.ResponseWriter, r *http.Request, team, id string) {
	var body networkUpdateBody
	if !decodeBody(w, r, &body) {
		return
	}
	if err := checkEgress(body.AllowOut, body.DenyOut, body.EgressProxy, body.Rules); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	err := s.backend.UpdateNetwork(r.Context(), team, id, NetworkUpdate{
		AllowOut: body.AllowOut, DenyOut: body.DenyOut, AllowInternetAccess: body.AllowInternetAccess,
	})
	if err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateAlias is the alias e2b's API gives a sandbox of t (the SDK's
// info.name): its first alias; here, where a template's ID is its name,
// the ID when it has none.
func templateAlias(t *Template) string {
	if len(t.Aliases) > 0 {
		return t.Aliases[0]
	}
	return t.ID
}

// aliases finds sandboxes' aliases (templateAlias) for one request,
// looking each template up once.
type aliases struct {
	ctx  context.Context
	s    *server
	team string
	seen map[string]string
}

func newAliases(ctx context.Context, s *server, team string) *aliases {
	return &aliases{ctx: ctx, s: s, team: team, seen: map[string]string{}}
}

// fill sets sb's alias when the backend left it empty: its template's, or
// none when the template is gone.
func (a *aliases) fill(sb *Sandbox) {
	if sb.Alias != "" || sb.TemplateID == "" {
		return
	}
	alias, ok := a.seen[sb.TemplateID]
	if !ok {
		// No team: the catalog only, never the snapshots on every host.
		if t, err := a.s.backend.Template(a.ctx, "", sb.TemplateID); err == nil {
			alias = templateAlias(t)
		}
		a.seen[sb.TemplateID] = alias
	}
	sb.Alias = alias
}
