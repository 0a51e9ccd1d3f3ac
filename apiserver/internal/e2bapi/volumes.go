package e2bapi

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/skiff-dev/skiff/shared/nodetoken"
)

// Volumes (e2b's): a team's files that outlive its sandboxes. The control
// routes (/volumes) take the API key; the content routes
// (/volumecontent/{volumeID}/{dir,path,file}), which e2b serves on the API
// host too, take only the volume's token (Authorization: Bearer), which
// POST /volumes and GET /volumes/{id} hand out (nodetoken.VolumeToken).

// VolumeTokenTTL is how long a volume token opens its volume (e2b's
// default VOLUME_TOKEN_DURATION).
const VolumeTokenTTL = time.Hour

// Volume is a volume as the handlers render it.
type Volume struct {
	ID   string
	Name string
	// SizeBytes is what it may hold (0: unlimited); UsedBytes what it
	// holds, -1 when not measured (lists).
	SizeBytes, UsedBytes int64
}

// VolumeMount is a volume of the team mounted in a new sandbox (e2b's
// SandboxVolumeMount).
type VolumeMount struct {
	Name string
	Path string
}

// ErrVolumeExists is a volume name the team has already.
var ErrVolumeExists = errors.New("volume name taken")

var (
	volumeNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	volumeIDRE   = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// maxVolumeName bounds a name (e2b's column is a VARCHAR(250)).
const maxVolumeName = 250

// volumeJSON is e2b's Volume; volumeAndTokenJSON its VolumeAndToken, with
// what Skiff adds: the size and what it uses (GET /volumes/{id}).
type volumeJSON struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

type volumeAndTokenJSON struct {
	VolumeID  string `json:"volumeID"`
	Name      string `json:"name"`
	Token     string `json:"token"`
	SizeBytes *int64 `json:"sizeBytes,omitempty"`
	UsedBytes *int64 `json:"usedBytes,omitempty"`
}

func (s *server) volumeRoutes() {
	m := s.mux
	m.HandleFunc("POST /volumes", s.authed(s.createVolume))
	m.HandleFunc("GET /volumes", s.authed(s.listVolumes))
	m.HandleFunc("GET /volumes/{volumeID}", s.authed(s.volumeRoute(s.getVolume)))
	m.HandleFunc("DELETE /volumes/{volumeID}", s.authed(s.volumeRoute(s.deleteVolume)))
	m.HandleFunc("/volumecontent/{volumeID}/{kind}", s.volumeContent)
}

// volumeRoute reads {volumeID}: one that is not a UUID answers e2b's 400.
func (s *server) volumeRoute(h func(w http.ResponseWriter, r *http.Request, team, id string)) teamHandler {
	return func(w http.ResponseWriter, r *http.Request, team string) {
		id := r.PathValue("volumeID")
		if !volumeIDRE.MatchString(id) {
			writeError(w, http.StatusBadRequest, "", "Invalid volume ID")
			return
		}
		h(w, r, team, id)
	}
}

func (s *server) token(team, id string) string {
	return nodetoken.VolumeToken(s.volumeKey, team, id, time.Now().Add(VolumeTokenTTL))
}

// createVolume serves POST /volumes: 201 with the volume and its token.
func (s *server) createVolume(w http.ResponseWriter, r *http.Request, team string) {
	var body struct {
		Name *string `json:"name"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Name == nil {
		writeError(w, http.StatusBadRequest, "", `Invalid volume name: property "name" is missing`)
		return
	}
	if !volumeNameRE.MatchString(*body.Name) || len(*body.Name) > maxVolumeName {
		writeError(w, http.StatusBadRequest, "", "Invalid volume name %s: letters, digits, '_' and '-', at most %d of them", echo(*body.Name), maxVolumeName)
		return
	}
	v, err := s.backend.CreateVolume(r.Context(), team, *body.Name)
	if errors.Is(err, ErrVolumeExists) {
		writeError(w, http.StatusBadRequest, "", "Volume with name '%s' already exists", *body.Name)
		return
	}
	if err != nil {
		s.writeBackendError(w, r, err, "volume")
		return
	}
	writeJSON(w, http.StatusCreated, volumeAndTokenJSON{VolumeID: v.ID, Name: v.Name, Token: s.token(team, v.ID)})
}

// listVolumes serves GET /volumes: the team's volumes, [] for none.
func (s *server) listVolumes(w http.ResponseWriter, r *http.Request, team string) {
	vs, err := s.backend.Volumes(r.Context(), team)
	if err != nil {
		s.writeBackendError(w, r, err, "volumes")
		return
	}
	out := make([]volumeJSON, 0, len(vs))
	for _, v := range vs {
		out = append(out, volumeJSON{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
}

// getVolume serves GET /volumes/{id}: the volume, a fresh token, and what
// it holds.
func (s *server) getVolume(w http.ResponseWriter, r *http.Request, team, id string) {
	v, err := s.backend.Volume(r.Context(), team, id)
	if err != nil {
		s.writeBackendError(w, r, err, "Volume") // 404 "Volume not found", as e2b's
		return
	}
	out := volumeAndTokenJSON{VolumeID: v.ID, Name: v.Name, Token: s.token(team, v.ID), SizeBytes: &v.SizeBytes}
	if v.UsedBytes >= 0 {
		out.UsedBytes = &v.UsedBytes
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteVolume serves DELETE /volumes/{id}: 204; 409 while a sandbox
// (running or paused) mounts it.
func (s *server) deleteVolume(w http.ResponseWriter, r *http.Request, team, id string) {
	err := s.backend.DeleteVolume(r.Context(), team, id)
	if err != nil {
		s.writeBackendError(w, r, err, "Volume") // 404 "Volume not found", as e2b's
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeContent serves /volumecontent/{volumeID}/{dir,path,file} for the
// holder of the volume's token, on a host that serves the volume. Its
// errors are e2b's content errors: {"code": "<status>", "message": …}.
func (s *server) volumeContent(w http.ResponseWriter, r *http.Request) {
	id, kind := r.PathValue("volumeID"), r.PathValue("kind")
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		WriteContentError(w, http.StatusUnauthorized, "missing volume token (send Authorization: Bearer <token> from the volume's create or getInfo)")
		return
	}
	team, vol, err := nodetoken.CheckVolumeToken(s.volumeKey, strings.TrimSpace(tok), time.Now())
	if err != nil {
		WriteContentError(w, http.StatusUnauthorized, "invalid or expired volume token: get a new one with the volume's getInfo or connect")
		return
	}
	if vol != id {
		WriteContentError(w, http.StatusForbidden, "the token is for another volume")
		return
	}
	if kind != "dir" && kind != "path" && kind != "file" {
		WriteContentError(w, http.StatusNotFound, fmt.Sprintf("no route /volumecontent/{volumeID}/%s (dir, path or file)", path.Base(kind)))
		return
	}
	s.backend.ServeVolumeContent(w, r, team, id, kind)
}

// WriteContentError writes e2b's content error shape.
func WriteContentError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"code": fmt.Sprint(status), "message": msg})
}

// checkVolumeMounts checks a create's volumeMounts as e2b does, gathering
// every fault into one 400: "invalid mounts:\n\t- volume mount #0: …".
func checkVolumeMounts(ms []volumeMountJSON) ([]VolumeMount, error) {
	var out []VolumeMount
	var faults []string
	seen := map[string]bool{}
	for i, m := range ms {
		p := m.Path
		var why string
		switch {
		case m.Name == "":
			why = "volume name cannot be empty"
		case p == "":
			why = "path cannot be empty"
		case !strings.HasPrefix(p, "/"):
			why = "path must be absolute"
		case path.Clean(p) != p:
			why = "path must not contain any '.' or '..' components"
		case p == "/" || under(p, "/proc") || under(p, "/sys") || under(p, "/dev") || under("/usr/bin/envd", p):
			why = fmt.Sprintf("path %s would hide what the sandbox runs on", p)
		case seen[p]:
			why = fmt.Sprintf("path '%s' is already used", p)
		}
		seen[p] = true
		if why != "" {
			faults = append(faults, fmt.Sprintf("volume mount #%d: %s", i, why))
			continue
		}
		out = append(out, VolumeMount{Name: m.Name, Path: p})
	}
	if len(faults) > 0 {
		return nil, MountsError(faults)
	}
	return out, nil
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// MountsError is e2b's answer to bad volume mounts, one fault a line.
func MountsError(faults []string) error {
	return Invalid("", "invalid mounts:\n\t- %s", strings.Join(faults, "\n\t- "))
}

// volumeMountsJSON renders a sandbox's mounts ([] for none).
func volumeMountsJSON(ms []VolumeMount) []volumeMountJSON {
	out := make([]volumeMountJSON, 0, len(ms))
	for _, m := range ms {
		out = append(out, volumeMountJSON(m))
	}
	return out
}
