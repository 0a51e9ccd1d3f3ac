// Package httperr writes the errors of envd's plain HTTP routes in e2b's
// shape: {"code":<status>,"message":"…"}.
package httperr

import (
	"encoding/json"
	"net/http"
)

// Write writes status with e2b's JSON error body.
func Write(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, message})
}
