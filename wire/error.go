package wire

import (
	"encoding/json"
	"net/http"
)

// Error is e2b's error body. The SDKs branch on Code (not on the HTTP
// status), so it is always present and always equals the status.
type Error struct {
	// SandboxID names the sandbox of e2b's proxy's 502 ("sandbox not
	// found"); empty elsewhere.
	SandboxID string `json:"sandboxId,omitempty"`
	Code      int    `json:"code"`
	Message   string `json:"message"`
	// Port names the sandbox's port of e2b's proxy's 502 for a port
	// nothing answers on; 0 elsewhere.
	Port int `json:"port,omitempty"`
	// ErrorCode is e2b's machine-readable code (sandbox_capacity_unavailable,
	// …); empty for most errors.
	ErrorCode string `json:"error_code,omitempty"`
}

// WriteError answers status with e2b's error body {"code":status,"message":
// message}.
func WriteError(w http.ResponseWriter, status int, message string) {
	Write(w, Error{Code: status, Message: message})
}

// Write answers e.Code with e as its JSON body. The body is valid JSON
// whatever the message holds; errors are never cached and never sniffed.
func Write(w http.ResponseWriter, e Error) {
	b, err := json.Marshal(e)
	if err != nil { // a struct of strings and an int: cannot happen
		e = Error{Code: http.StatusInternalServerError, Message: "encode error"}
		b, _ = json.Marshal(e)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(e.Code)
	_, _ = w.Write(append(b, '\n'))
}
