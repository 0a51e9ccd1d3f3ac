package e2bapi

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// headerNextToken carries the cursor of the next page; absent or empty
// means the last page (the SDK sets hasNext = !!header).
const headerNextToken = "X-Next-Token"

// listQuery is a parsed GET /sandboxes or /v2/sandboxes query.
type listQuery struct {
	states       []State
	metadata     map[string]string
	desc         bool
	startedAfter time.Time
	template     string
	// limit is 0 for "no limit" (the deprecated v1 list, unless asked).
	limit  int
	cursor *listKey
}

// listKey is a sandbox's place in a listing: start time, then ID.
type listKey struct {
	startedAt time.Time
	id        string
}

// compareKeys orders keys as e2b does: descending by start time with IDs
// ascending among equals, or the exact reverse for ascending order. It is a
// total order, so a cursor lands between two sandboxes unambiguously.
func compareKeys(a, b listKey, desc bool) int {
	c := a.startedAt.Compare(b.startedAt)
	if c == 0 {
		c = -strings.Compare(a.id, b.id)
	}
	if desc {
		return -c
	}
	return c
}

// encodeCursor makes the opaque X-Next-Token of the last sandbox on a page.
func encodeCursor(k listKey) string {
	t := k.startedAt
	raw := strconv.FormatInt(t.Unix(), 10) + "." + strconv.Itoa(t.Nanosecond()) + "." + k.id
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

var errBadCursor = errors.New("not a token this server issued")

func decodeCursor(tok string) (*listKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, errBadCursor
	}
	parts := strings.SplitN(string(b), ".", 3)
	if len(parts) != 3 || parts[2] == "" || len(parts[2]) > maxEcho {
		return nil, errBadCursor
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	nsec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || nsec < 0 || nsec >= int64(time.Second) {
		return nil, errBadCursor
	}
	return &listKey{startedAt: time.Unix(sec, nsec), id: parts[2]}, nil
}

// parseMetadataFilter decodes the metadata query parameter exactly as e2b's
// API does. The SDK URL-encodes each key and value, joins them as a query
// string (which encodes them again), and the HTTP client encodes the whole
// parameter once more: {user: "a b"} travels as metadata=user%3Da%252520b.
// Given the parameter value (already decoded once by the query parser),
// this unescapes the whole string, splits it on '&' and then on '=', and
// unescapes each key and value. Every pair must have exactly one '='.
func parseMetadataFilter(v string) (map[string]string, error) {
	q, err := url.QueryUnescape(v)
	if err != nil {
		return nil, Invalid("metadata", "cannot unescape the filter: %v", err)
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(q, "&") {
		parts := strings.Split(pair, "=")
		if len(parts) != 2 {
			return nil, Invalid("metadata", "%s is not one key=value pair", echo(pair))
		}
		k, err := url.QueryUnescape(parts[0])
		if err != nil {
			return nil, Invalid("metadata", "cannot unescape key %s: %v", echo(parts[0]), err)
		}
		val, err := url.QueryUnescape(parts[1])
		if err != nil {
			return nil, Invalid("metadata", "cannot unescape value %s: %v", echo(parts[1]), err)
		}
		out[k] = val
	}
	return out, nil
}

// parseStates reads the form-style (explode=false) state list.
func parseStates(v string) ([]State, error) {
	var out []State
	for s := range strings.SplitSeq(v, ",") {
		st := State(s)
		if st != StateRunning && st != StatePaused {
			return nil, Invalid("state", "%s is not running or paused", echo(s))
		}
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out, nil
}

// parseLimit reads a limit in [lo, hi]; absent gives def.
func parseLimit(q url.Values, name string, def, lo, hi int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, Invalid(name, "must be an integer from %d to %d, got %s", lo, hi, echo(v))
	}
	return n, nil
}

func parseListQuery(q url.Values, v2 bool) (*listQuery, error) {
	lq := &listQuery{desc: true, states: []State{StateRunning, StatePaused}}
	if !v2 {
		// The deprecated list shows running sandboxes only and, unless a
		// limit is asked for, all of them in one answer (old SDKs do not
		// paginate).
		lq.states = []State{StateRunning}
	}
	var err error
	if v, ok := q["state"]; ok && strings.Join(v, ",") != "" {
		if lq.states, err = parseStates(strings.Join(v, ",")); err != nil {
			return nil, err
		}
	}
	// An empty filter (metadata=) matches everything: the SDK sends one for
	// an empty object, where e2b's API answers 400.
	if v := q.Get("metadata"); v != "" {
		if lq.metadata, err = parseMetadataFilter(v); err != nil {
			return nil, err
		}
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return nil, Invalid("order", "must be asc or desc, got %s", echo(o))
	}
	if v := q.Get("startedAfter"); v != "" {
		if lq.startedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return nil, Invalid("startedAfter", "must be an RFC 3339 time, got %s", echo(v))
		}
	}
	lq.template = q.Get("template")
	if strings.Contains(lq.template, ":") {
		// As e2b's: a sandbox records its template, not a tag of it.
		return nil, Invalid("", "Invalid template: tags are not supported here because sandboxes are not tag-scoped")
	}
	def := defaultListLimit
	if !v2 {
		def = 0
	}
	if lq.limit, err = parseLimit(q, "limit", def, 1, maxListLimit); err != nil {
		return nil, err
	}
	if tok := q.Get("nextToken"); tok != "" {
		if lq.cursor, err = decodeCursor(tok); err != nil {
			return nil, Invalid("nextToken", "%v", err)
		}
	}
	return lq, nil
}

// list serves GET /v2/sandboxes (running and paused by default, pages of
// at most 100) and the deprecated GET /sandboxes (running only).
func (s *server) list(v2 bool) teamHandler {
	return func(w http.ResponseWriter, r *http.Request, team string) {
		lq, err := parseListQuery(r.URL.Query(), v2)
		if err != nil {
			writeInvalid(w, err)
			return
		}
		templates := []string{lq.template}
		if lq.template != "" {
			// The filter may name an alias; match the template's ID too.
			if tpl, err := s.backend.Template(r.Context(), team, lq.template); err == nil {
				templates = append(templates, tpl.ID)
			}
		}
		all, err := s.backend.List(r.Context(), team, lq.states)
		if err != nil {
			s.writeBackendError(w, r, err, "sandboxes")
			return
		}
		page, next := selectPage(all, lq, templates)
		out := make([]listedSandboxJSON, 0, len(page))
		names := newAliases(r.Context(), s, team)
		for i := range page {
			names.fill(&page[i])
			out = append(out, s.listedJSON(&page[i]))
		}
		if next != "" {
			w.Header().Set(headerNextToken, next)
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// selectPage filters, orders and cuts one page; it returns the cursor of
// the next page, or "" on the last one.
func selectPage(all []Sandbox, lq *listQuery, templates []string) ([]Sandbox, string) {
	// Pointers: a Sandbox is ~250 bytes, and sorting thousands of them by
	// value was most of a list's time.
	keep := make([]*Sandbox, 0, len(all))
	for i := range all {
		sb := &all[i]
		if !slices.Contains(lq.states, sb.State) ||
			!matchMetadata(sb.Metadata, lq.metadata) ||
			(lq.template != "" && !slices.Contains(templates, sb.TemplateID) && sb.Alias != lq.template) ||
			(!lq.startedAfter.IsZero() && sb.StartedAt.Before(lq.startedAfter)) {
			continue
		}
		keep = append(keep, sb)
	}
	keep, next := cutPage(keep, keyOf, lq.cursor, lq.desc, lq.limit)
	page := make([]Sandbox, len(keep))
	for i, sb := range keep {
		page[i] = *sb
	}
	return page, next
}

func keyOf(sb *Sandbox) listKey { return listKey{startedAt: sb.StartedAt, id: sb.ID} }

// cutPage orders items by key (descending or not), drops those at or
// before cursor, and keeps a page of at most limit (0: no limit). It
// returns the page and the cursor of the next one, or "" on the last.
func cutPage[T any](items []*T, key func(*T) listKey, cursor *listKey, desc bool, limit int) ([]*T, string) {
	if cursor != nil {
		items = slices.DeleteFunc(items, func(it *T) bool { return compareKeys(key(it), *cursor, desc) <= 0 })
	}
	slices.SortFunc(items, func(a, b *T) int { return compareKeys(key(a), key(b), desc) })
	if limit > 0 && len(items) > limit {
		items = items[:limit]
		return items, encodeCursor(key(items[limit-1]))
	}
	return items, ""
}

func matchMetadata(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
