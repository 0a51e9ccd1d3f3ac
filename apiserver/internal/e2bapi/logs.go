package e2bapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// logLevels are e2b's LogLevel values, least severe first.
var logLevels = []string{"debug", "info", "warn", "error"}

func levelOf(e *LogEntry) string {
	if slices.Contains(logLevels, e.Level) {
		return e.Level
	}
	return "info"
}

func toLogEntryJSON(e *LogEntry) logEntryJSON {
	fields := map[string]string{}
	if e.Source != "" {
		fields["source"] = e.Source
	}
	return logEntryJSON{Timestamp: e.Timestamp.UTC(), Level: levelOf(e), Message: e.Line, Fields: fields}
}

// rawLine is a line as v1's logs carry it: the whole record, as JSON, as
// e2b's do (its log store's raw line), which the e2b CLI's `sandbox logs`
// parses for its level (which must be there), logger (filtered by
// --loggers: here the line's source) and the rest.
func rawLine(e *LogEntry) string {
	b, err := json.Marshal(struct {
		Level   string `json:"level"`
		Logger  string `json:"logger"`
		Message string `json:"message"`
	}{levelOf(e), cmp.Or(e.Source, "envd"), e.Line})
	if err != nil {
		return e.Line // not for a struct of strings
	}
	return string(b)
}

// parseMillis reads an optional non-negative Unix time in milliseconds.
func parseMillis(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > maxUnixSeconds*1000 {
		return time.Time{}, Invalid(name, "must be a Unix time in milliseconds, got %s", echo(v))
	}
	return time.UnixMilli(n), nil
}

// logsV1 serves the deprecated GET /sandboxes/{id}/logs (start in ms,
// limit default 1000): the oldest lines at or after start, both as plain
// lines and as structured entries.
func (s *server) logsV1(w http.ResponseWriter, r *http.Request, team, id string) {
	q := r.URL.Query()
	start, err := parseMillis(q, "start")
	if err != nil {
		writeInvalid(w, err)
		return
	}
	limit, err := parseLimit(q, "limit", defaultLogLimit, 0, maxLogLimit)
	if err != nil {
		writeInvalid(w, err)
		return
	}
	entries, err := s.backend.Logs(r.Context(), team, id, LogQuery{Start: start, Limit: limit, Forward: true})
	if err = goneIsEmpty(err); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	out := sandboxLogsJSON{Logs: []logLineJSON{}, LogEntries: []logEntryJSON{}}
	for i := range entries {
		e := &entries[i]
		if len(out.Logs) == limit {
			break
		}
		if e.Timestamp.Before(start) {
			continue
		}
		out.Logs = append(out.Logs, logLineJSON{Timestamp: e.Timestamp.UTC(), Line: rawLine(e)})
		out.LogEntries = append(out.LogEntries, toLogEntryJSON(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// logsV2 serves GET /v2/sandboxes/{id}/logs: cursor (ms), limit ≤ 1000,
// direction forward (oldest first, from the cursor on) or backward (newest
// first, up to the cursor; the default, as e2b's), level (the minimum),
// search (a case-sensitive substring of the message, ≤ 256 bytes).
func (s *server) logsV2(w http.ResponseWriter, r *http.Request, team, id string) {
	q := r.URL.Query()
	cursor, err := parseMillis(q, "cursor")
	if err != nil {
		writeInvalid(w, err)
		return
	}
	limit, err := parseLimit(q, "limit", defaultLogLimit, 0, maxLogLimit)
	if err != nil {
		writeInvalid(w, err)
		return
	}
	// e2b's default is backward: the newest lines, newest first.
	backward := true
	switch d := q.Get("direction"); d {
	case "forward":
		backward = false
	case "", "backward":
	default:
		writeInvalid(w, Invalid("direction", "must be forward or backward, got %s", echo(d)))
		return
	}
	minLevel := 0
	if l := q.Get("level"); l != "" {
		if minLevel = slices.Index(logLevels, l); minLevel < 0 {
			writeInvalid(w, Invalid("level", "must be one of %s, got %s", strings.Join(logLevels, ", "), echo(l)))
			return
		}
	}
	search := q.Get("search")
	if len(search) > maxLogSearch {
		writeInvalid(w, Invalid("search", "is longer than %d bytes", maxLogSearch))
		return
	}
	lq := LogQuery{Limit: limit, Forward: !backward, Search: search}
	if minLevel > 0 {
		lq.MinLevel = logLevels[minLevel]
	}
	if backward {
		lq.End = cursor
	} else {
		lq.Start = cursor
	}
	entries, err := s.backend.Logs(r.Context(), team, id, lq)
	if err = goneIsEmpty(err); err != nil {
		s.writeBackendError(w, r, err, sandboxSubject(id))
		return
	}
	keep := func(e *LogEntry) bool {
		if !cursor.IsZero() {
			if backward && e.Timestamp.After(cursor) || !backward && e.Timestamp.Before(cursor) {
				return false
			}
		}
		return slices.Index(logLevels, levelOf(e)) >= minLevel && strings.Contains(e.Line, search)
	}
	out := sandboxLogsV2JSON{Logs: []logEntryJSON{}}
	for i := range entries {
		j := i
		if backward {
			j = len(entries) - 1 - i
		}
		if len(out.Logs) == limit {
			break
		}
		if e := &entries[j]; keep(e) {
			out.Logs = append(out.Logs, toLogEntryJSON(e))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// goneIsEmpty makes the logs or metrics of a sandbox the team has not (one
// killed, another team's, one that never was) an empty answer, not a 404:
// e2b's come from stores that outlive the sandbox and are read by team,
// so its SDK and CLI read an ended sandbox's as none (the CLI's `logs
// --follow` ends when the sandbox does). Here the host keeps them only
// while the sandbox lives.
func goneIsEmpty(err error) error {
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}
