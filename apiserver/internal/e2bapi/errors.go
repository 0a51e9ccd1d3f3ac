package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/skiff-dev/skiff/wire"
)

// e2b's machine-readable error codes (error_code).
const (
	codeCapacity         = "sandbox_capacity_unavailable"
	codePlacementTimeout = "sandbox_placement_timeout"
	codeInternal         = "internal_server_error"
	codeHostUnavailable  = "sandbox_host_unavailable"
)

// maxEcho bounds how much of a caller's input an error message repeats.
const maxEcho = 64

// writeJSON writes v as the JSON body of a response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value written here is a plain struct of strings, numbers and
		// maps; failing to encode one is a bug, answered honestly.
		wire.WriteError(w, http.StatusInternalServerError, "encode response")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError writes e2b's error shape (wire.Error), with e2b's
// machine-readable errorCode when it is not empty.
func writeError(w http.ResponseWriter, status int, errorCode, format string, args ...any) {
	wire.Write(w, wire.Error{Code: status, Message: fmt.Sprintf(format, args...), ErrorCode: errorCode})
}

// echo quotes a piece of caller input for an error message, cut to maxEcho
// bytes.
func echo(s string) string {
	if len(s) > maxEcho {
		s = s[:maxEcho] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// writeBackendError maps a Backend error to the wire: the one place where
// the categories of backend.go become statuses. subject names what was
// looked up (`sandbox "…"`) for the 404 message, so that another team's
// sandbox answers exactly like a missing one.
func (s *server) writeBackendError(w http.ResponseWriter, r *http.Request, err error, subject string) {
	var inv *InvalidError
	var vh *VolumeHostError
	switch {
	case errors.As(err, &vh):
		s.log.WarnContext(r.Context(), "volume host", "error", err)
		code := codeHostUnavailable
		if errors.Is(err, ErrCapacity) {
			code = codeCapacity
		}
		writeError(w, http.StatusServiceUnavailable, code, "%s", vh.Message())
	case errors.As(err, &inv):
		writeError(w, http.StatusBadRequest, "", "%s", inv.Error())
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "", "%s not found", subject)
	case errors.Is(err, ErrConflict):
		msg := err.Error()
		if ce := new(ConflictError); errors.As(err, &ce) {
			msg = ce.Reason
		}
		writeError(w, http.StatusConflict, "", "%s", msg)
	case errors.Is(err, ErrRateLimited):
		writeError(w, http.StatusTooManyRequests, "", "%s", err.Error())
	case errors.Is(err, ErrCapacity):
		// Fixed texts for 5xx: the backend's words may name nodes.
		s.log.WarnContext(r.Context(), "no capacity", "error", err)
		writeError(w, http.StatusServiceUnavailable, codeCapacity, "%s", capacityMessage(r.Pattern))
	case errors.Is(err, ErrPlacementTimeout):
		s.log.WarnContext(r.Context(), "placement timed out", "error", err)
		writeError(w, http.StatusGatewayTimeout, codePlacementTimeout, "placing the sandbox timed out; retry later")
	case errors.Is(err, ErrUnavailable):
		// The backend logs an unreachable host once, not per request.
		writeError(w, http.StatusServiceUnavailable, codeHostUnavailable, "the sandbox's host is not answering; retry later")
	case errors.Is(err, ErrUnsupported):
		writeError(w, http.StatusNotImplemented, "", "%s", err.Error())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads this answer.
		writeError(w, http.StatusServiceUnavailable, "", "request canceled")
	default:
		s.log.ErrorContext(r.Context(), "backend failed", "method", r.Method, "path", r.URL.Path, "error", err)
		writeError(w, http.StatusInternalServerError, codeInternal, "internal server error")
	}
}

// capacityMessage is the 503 of a route (its ServeMux pattern) whose
// backend found no room: a new sandbox's, unless the route makes
// something else (a host's disk below its reserve refuses those too).
func capacityMessage(pattern string) string {
	switch pattern {
	case "POST /volumes":
		return "no host has room for a new volume now; retry later"
	case "POST /sandboxes/{id}/snapshots":
		return "the sandbox's host has no room for a snapshot now; retry later"
	case "POST /sandboxes/{id}/fork":
		return "the sandbox's host has no room for a fork now; retry later"
	case "POST /sandboxes/{id}/pause":
		return "the sandbox's host has no room to pause it now; retry later"
	}
	return "no node has capacity for this sandbox now; retry later"
}
