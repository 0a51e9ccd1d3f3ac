package e2bapi

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// buildID derives a stable UUID-shaped e2b buildID from a template's ID and
// version: e2b clients treat it as a UUID, Skiff has no builds.
func buildID(t *Template) string {
	sum := sha256.Sum256([]byte(t.ID + "\x00" + t.Version))
	sum[6] = sum[6]&0x0f | 0x80 // version 8: custom
	sum[8] = sum[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// templateNames is e2b's "names": the ID, then the aliases.
func templateNames(t *Template) []string {
	names := []string{t.ID}
	for _, a := range t.Aliases {
		if a != t.ID && !slices.Contains(names, a) {
			names = append(names, a)
		}
	}
	return names
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// toTemplateJSON renders a template. Skiff's templates are cluster-wide
// (SandboxTemplate objects), so every one is public and ready, with one
// build.
func toTemplateJSON(t *Template) templateJSON {
	return templateJSON{
		TemplateID:  t.ID,
		BuildID:     buildID(t),
		CPUCount:    cpuCount(t.CPUMilli),
		MemoryMB:    clamp32(t.MemoryMB),
		DiskSizeMB:  clamp32(t.DiskMB),
		Public:      true,
		Aliases:     nonNilStrings(t.Aliases),
		Names:       templateNames(t),
		CreatedAt:   t.CreatedAt.UTC(),
		UpdatedAt:   updatedAt(t).UTC(),
		BuildCount:  1,
		EnvdVersion: t.EnvdVersion,
		BuildStatus: "ready",
	}
}

func updatedAt(t *Template) time.Time {
	if t.UpdatedAt.IsZero() {
		return t.CreatedAt
	}
	return t.UpdatedAt
}

func (s *server) sortedTemplates(w http.ResponseWriter, r *http.Request, team string) ([]Template, bool) {
	ts, err := s.backend.Templates(r.Context(), team)
	if err != nil {
		s.writeBackendError(w, r, err, "templates")
		return nil, false
	}
	slices.SortFunc(ts, func(a, b Template) int { return strings.Compare(a.ID, b.ID) })
	return ts, true
}

// templatesV1 serves GET /templates: every template (teamID is ignored: a
// key belongs to one team).
func (s *server) templatesV1(w http.ResponseWriter, r *http.Request, team string) {
	ts, ok := s.sortedTemplates(w, r, team)
	if !ok {
		return
	}
	out := make([]templateJSON, 0, len(ts))
	for i := range ts {
		out = append(out, toTemplateJSON(&ts[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// templatesV2 serves GET /v2/templates: pages ordered by template ID, with
// X-Next-Token.
func (s *server) templatesV2(w http.ResponseWriter, r *http.Request, team string) {
	q := r.URL.Query()
	limit, err := parseLimit(q, "limit", defaultListLimit, 1, maxListLimit)
	if err != nil {
		writeInvalid(w, err)
		return
	}
	after := ""
	if tok := q.Get("nextToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) == 0 {
			writeInvalid(w, Invalid("nextToken", "%v", errBadCursor))
			return
		}
		after = string(b)
	}
	ts, ok := s.sortedTemplates(w, r, team)
	if !ok {
		return
	}
	out := make([]templateJSON, 0, min(limit, len(ts)))
	for i := range ts {
		if after != "" && ts[i].ID <= after {
			continue
		}
		if len(out) == limit {
			w.Header().Set(headerNextToken, base64.RawURLEncoding.EncodeToString([]byte(out[len(out)-1].TemplateID)))
			break
		}
		out = append(out, toTemplateJSON(&ts[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// templateWithBuilds serves GET /templates/{templateID}: the template and
// its one build (limit and nextToken have nothing to page).
func (s *server) templateWithBuilds(w http.ResponseWriter, r *http.Request, team string) {
	name := r.PathValue("templateID")
	t, err := s.backend.Template(r.Context(), team, name)
	if err != nil {
		s.writeBackendError(w, r, err, "template "+echo(name))
		return
	}
	tj := toTemplateJSON(t)
	writeJSON(w, http.StatusOK, templateWithBuildsJSON{
		TemplateID: tj.TemplateID,
		Public:     tj.Public,
		Aliases:    tj.Aliases,
		Names:      tj.Names,
		CreatedAt:  tj.CreatedAt,
		UpdatedAt:  tj.UpdatedAt,
		Builds: []templateBuildJSON{{
			BuildID:     tj.BuildID,
			Status:      tj.BuildStatus,
			CreatedAt:   tj.CreatedAt,
			UpdatedAt:   tj.UpdatedAt,
			FinishedAt:  tj.UpdatedAt,
			CPUCount:    tj.CPUCount,
			MemoryMB:    tj.MemoryMB,
			DiskSizeMB:  tj.DiskSizeMB,
			EnvdVersion: tj.EnvdVersion,
		}},
	})
}

// templateSub serves GET /templates/aliases/{alias} and the unsupported
// GET /templates/{templateID}/tags.
func (s *server) templateSub(w http.ResponseWriter, r *http.Request, team string) {
	id, sub := r.PathValue("templateID"), r.PathValue("sub")
	switch {
	case id == "aliases":
		s.templateAlias(w, r, team, sub)
	case sub == "tags":
		for _, u := range unsupportedRoutes {
			if u.Pattern == templateTagsPattern {
				notImplemented(u)(w, r, team)
			}
		}
	default:
		writeError(w, http.StatusNotFound, "", "no route %s %s", r.Method, echo(r.URL.Path))
	}
}

// templateAlias serves GET /templates/aliases/{alias}: 200 with the
// template's ID, or 404.
func (s *server) templateAlias(w http.ResponseWriter, r *http.Request, team, alias string) {
	t, err := s.backend.Template(r.Context(), team, alias)
	if err != nil {
		s.writeBackendError(w, r, err, "template alias "+echo(alias))
		return
	}
	writeJSON(w, http.StatusOK, templateAliasJSON{TemplateID: t.ID, Public: true})
}
