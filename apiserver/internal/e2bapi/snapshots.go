package e2bapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/skiff-dev/skiff/shared/sandboxid"
	"github.com/skiff-dev/skiff/wire"
)

// Snapshot is a team's snapshot as the handlers render it. In e2b a
// snapshot is a template: its snapshotID is "<team>/<name>:<tag>" when it
// has a name, else "<ID>:default", and a create names it as its
// templateID.
type Snapshot struct {
	ID   string
	Team string
	// Name and Tag are the name given at capture; Name is empty for none.
	Name string
	Tag  string
	// SourceSandbox is the sandbox it was taken from.
	SourceSandbox   string
	Template        string
	TemplateVersion string
	CreatedAt       time.Time
	SizeBytes       int64
	// CPUMilli and MemoryMiB are its source's, a sandbox from it's.
	CPUMilli, MemoryMiB int64
	// Node holds it: the host that took it, when that host answers, else
	// a host that pulled it.
	Node string
	// PulledFrom is the node Node pulled it from; empty when Node took it.
	PulledFrom string
	// Nodes are every host that holds it, Node first.
	Nodes []string
}

// DefaultSnapshotTag is the tag of a snapshot name given without one.
const DefaultSnapshotTag = "default"

// SnapshotID is the snapshotID e2b answers for s.
func (s *Snapshot) SnapshotID() string {
	if s.Name != "" {
		return s.Team + "/" + s.Name + ":" + s.tag()
	}
	return s.ID + ":" + DefaultSnapshotTag
}

func (s *Snapshot) tag() string {
	if s.Tag == "" {
		return DefaultSnapshotTag
	}
	return s.Tag
}

// Names are e2b's names: "<team>/<name>" when it has a name.
func (s *Snapshot) Names() []string {
	if s.Name == "" {
		return []string{}
	}
	return []string{s.Team + "/" + s.Name}
}

// SnapshotFilter selects snapshots in Backend.Snapshots.
type SnapshotFilter struct {
	// SourceSandbox keeps those taken from it, when set.
	SourceSandbox string
	// Name keeps the snapshot with this ID, or this name (every tag) or
	// name:tag, when set; the team's namespace is already stripped.
	Name string
}

// ForkResult is one fork: a sandbox, or the error that kept it from
// starting.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// SnapshotRef is what a templateID or a snapshotID names of a team's
// snapshots: an ID, or a name with its tag.
type SnapshotRef struct {
	ID   string
	Name string
	Tag  string
}

// String is the reference as sandboxd takes it: the ID, or "name:tag".
func (r SnapshotRef) String() string {
	if r.ID != "" {
		return r.ID
	}
	return r.Name + ":" + r.Tag
}

// ParseSnapshotRef reads a snapshotID (or a templateID that may name a
// snapshot) of team: "<ID>", "<ID>:<tag>", "<name>", "<name>:<tag>", or
// either with the team's namespace "<team>/…". ok is false when it cannot
// name one of team's snapshots (another namespace, a malformed value).
func ParseSnapshotRef(team, s string) (ref SnapshotRef, ok bool) {
	if ns, rest, found := strings.Cut(s, "/"); found {
		if ns != team {
			return ref, false
		}
		s = rest
	}
	base, tag, _ := strings.Cut(s, ":")
	if tag == "" {
		tag = DefaultSnapshotTag
	}
	if base == "" || strings.ContainsAny(base, "/:") || strings.Contains(tag, ":") {
		return ref, false
	}
	if validID(base) {
		// An ID has no tag but the default one.
		return SnapshotRef{ID: base}, tag == DefaultSnapshotTag
	}
	return SnapshotRef{Name: base, Tag: tag}, true
}

type snapshotBody struct {
	Name *string `json:"name"`
}

type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotJSON(s *Snapshot) snapshotJSON {
	return snapshotJSON{SnapshotID: s.SnapshotID(), Names: s.Names()}
}

// snapshotName reads a name as e2b takes it: optional namespace (the
// team's), alias, optional tag.
func snapshotName(team, name string) (string, error) {
	if ns, rest, found := strings.Cut(name, "/"); found {
		if ns != team {
			return "", Invalid("name", "namespace %s does not match the team's (%s)", echo(ns), echo(team))
		}
		name = rest
	}
	if name == "" || strings.Count(name, ":") > 1 {
		return "", Invalid("name", "%s is not a name, or a name:tag", echo(name))
	}
	return name, nil
}

// createSnapshot serves POST /sandboxes/{id}/snapshots: 201 with e2b's
// SnapshotInfo.
func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request, team, id string) {
	var body snapshotBody
	if !decodeBody(w, r, &body) {
		return
	}
	name := ""
	if body.Name != nil {
		var err error
		if name, err = snapshotName(team, *body.Name); err != nil {
			s.writeBackendError(w, r, err, "")
			return
		}
		// Every lookup (a create's templateID, a delete, ParseSnapshotRef)
		// takes a name shaped like an ID for an ID: a snapshot by that
		// name could be made, and never used or deleted.
		if base, _, _ := strings.Cut(name, ":"); validID(base) {
			writeError(w, http.StatusBadRequest, "", "name: %s has the shape of a snapshot ID (%d characters of [a-z0-9]), which names snapshots by ID; choose another name",
				echo(base), sandboxid.Len)
			return
		}
	}
	snap, err := s.backend.Snapshot(r.Context(), team, id, name)
	if err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	writeJSON(w, http.StatusCreated, toSnapshotJSON(snap))
}

// Snapshot pages: e2b's default and maximum limit.
const (
	snapshotsDefaultLimit = 100
	snapshotsMaxLimit     = 100
)

// listSnapshots serves GET /snapshots: the team's snapshots, newest first,
// paged with X-Next-Token, filtered by sandboxID and name.
func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request, team string) {
	q := r.URL.Query()
	limit, err := parseLimit(q, "limit", snapshotsDefaultLimit, 1, snapshotsMaxLimit)
	if err != nil {
		s.writeBackendError(w, r, err, "")
		return
	}
	var cursor *listKey
	if tok := q.Get("nextToken"); tok != "" {
		if cursor, err = decodeCursor(tok); err != nil {
			writeError(w, http.StatusBadRequest, "", "Invalid next token")
			return
		}
	}
	var f SnapshotFilter
	if v := q.Get("sandboxID"); v != "" {
		id, ok := shortID(v)
		if !ok {
			writeError(w, http.StatusBadRequest, "", "Invalid sandbox ID")
			return
		}
		f.SourceSandbox = id
	}
	if v := q.Get("name"); v != "" {
		if f.Name, err = snapshotName(team, v); err != nil {
			s.writeBackendError(w, r, err, "")
			return
		}
	}
	snaps, err := s.backend.Snapshots(r.Context(), team, f)
	if err != nil {
		s.writeBackendError(w, r, err, "")
		return
	}
	ptrs := make([]*Snapshot, len(snaps))
	for i := range snaps {
		ptrs[i] = &snaps[i]
	}
	key := func(sn *Snapshot) listKey { return listKey{startedAt: sn.CreatedAt, id: sn.ID} }
	page, next := cutPage(ptrs, key, cursor, true, limit)
	if next != "" {
		w.Header().Set(headerNextToken, next)
	}
	out := make([]snapshotJSON, len(page))
	for i, sn := range page {
		out[i] = toSnapshotJSON(sn)
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate serves DELETE /templates/{templateID}: the name resolves
// as a create's templateID does; a snapshot is deleted (204); a template
// Skiff does not delete over e2b's API (501); anything else is a 404,
// which the SDK's deleteSnapshot reads as false.
func (s *server) deleteTemplate(w http.ResponseWriter, r *http.Request, team string) {
	raw := r.PathValue("templateID")
	tpl, err := s.backend.Template(r.Context(), team, raw)
	switch {
	case err == nil && tpl.Snapshot == nil:
		writeError(w, http.StatusNotImplemented, "", "DELETE /templates/{templateID} of a template is not supported by Skiff yet (delete its SandboxTemplate); only snapshots are deleted here")
		return
	case err == nil:
		err = s.backend.DeleteSnapshot(r.Context(), team, SnapshotRef{ID: tpl.Snapshot.ID})
	}
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "", "template %s not found", echo(raw))
	default:
		s.writeBackendError(w, r, err, "template "+echo(raw))
	}
}

type forkBody struct {
	Timeout *int64 `json:"timeout"`
	Count   *int64 `json:"count"`
}

type forkResultJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *wire.Error  `json:"error,omitempty"`
}

// fork serves POST /sandboxes/{id}/fork: 201 with one result per fork.
func (s *server) fork(w http.ResponseWriter, r *http.Request, team, id string) {
	var body forkBody
	if !decodeBody(w, r, &body) {
		return
	}
	timeout, err := seconds("timeout", body.Timeout, defaultTimeoutV1, 1, s.maxTimeout)
	if err != nil {
		s.writeBackendError(w, r, err, "")
		return
	}
	count := int64(1)
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > maxForks {
		writeError(w, http.StatusBadRequest, "", "count: must be between 1 and %d, got %s", maxForks, strconv.FormatInt(count, 10))
		return
	}
	results, err := s.backend.Fork(r.Context(), team, id, int(count), timeout)
	if err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	out := make([]forkResultJSON, len(results))
	for i, res := range results {
		if res.Err != nil || res.Sandbox == nil {
			status, message := s.forkErrorStatus(r, res.Err)
			out[i].Error = &wire.Error{Code: status, Message: message}
			continue
		}
		sb := s.sandboxJSON(res.Sandbox)
		out[i].Sandbox = &sb
	}
	writeJSON(w, http.StatusCreated, out)
}

// maxForks is e2b's maximum count.
const maxForks = 100

// forkErrorStatus is the status and message of one failed fork, as
// writeBackendError would answer it.
func (s *server) forkErrorStatus(r *http.Request, err error) (int, string) {
	if err == nil {
		return http.StatusInternalServerError, "the fork did not start"
	}
	var inv *InvalidError
	switch {
	case errors.As(err, &inv):
		return http.StatusBadRequest, inv.Error()
	case errors.Is(err, ErrCapacity):
		return http.StatusServiceUnavailable, "no capacity for this fork on the sandbox's host now; retry later"
	case errors.Is(err, ErrRateLimited):
		return http.StatusTooManyRequests, err.Error()
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable, "the sandbox's host is not answering; retry later"
	}
	s.log.ErrorContext(r.Context(), "a fork failed", "error", err)
	return http.StatusInternalServerError, "the fork did not start"
}
