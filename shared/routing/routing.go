// Package routing reads which sandbox, and which port in it, an e2b SDK
// request is for, the way e2b's edge does (docs/e2b-protocol.md §3.7). The
// envd proxy and sandboxd's relay share it, so both edges agree.
//
// A request names its target with the headers E2b-Sandbox-Id and
// E2b-Sandbox-Port (both, or neither), or else with its host,
// `<port>-<sandboxID>.<domain>`.
package routing

import (
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/skiff-dev/skiff/wire"
)

const (
	// HeaderSandboxID carries the target sandbox when the SDK talks to one
	// shared sandbox URL: wire.SandboxIDHeader, under the name its users
	// (sandboxd's server among them) know.
	HeaderSandboxID = wire.SandboxIDHeader
	// HeaderSandboxPort carries the target port, with HeaderSandboxID:
	// wire.SandboxPortHeader.
	HeaderSandboxPort = wire.SandboxPortHeader
	// EnvdPort is the port of envd inside every sandbox.
	EnvdPort = 49983
	// maxIDLen bounds a sandbox ID read from a request.
	maxIDLen = 64
)

var (
	// ErrNoTarget is returned for a request that names no sandbox.
	ErrNoTarget = errors.New("the request names no sandbox: set E2b-Sandbox-Id and E2b-Sandbox-Port, or use a <port>-<sandboxID> host")
	// ErrBadTarget is wrapped by the errors for a malformed target.
	ErrBadTarget = errors.New("bad sandbox target")
)

// Target is a port in a sandbox.
type Target struct {
	SandboxID string
	Port      uint16
}

// IsEnvd reports whether the target is the sandbox's envd.
func (t Target) IsEnvd() bool { return t.Port == EnvdPort }

// Parse reads a request's target: the headers when either is present (then
// both must be, once each or repeated with the same value, not empty, and
// well-formed: e2b's "missing header"), else the host. It returns
// ErrNoTarget when the request names none, and an error wrapping
// ErrBadTarget when it names one badly. Both edges (the envd proxy and
// sandboxd's relay) parse with it, so a request one refuses the other
// refuses too.
func Parse(r *http.Request) (Target, error) {
	idVals, hasID := r.Header[HeaderSandboxID]
	portVals, hasPort := r.Header[HeaderSandboxPort]
	if hasID || hasPort {
		id, err := single(HeaderSandboxID, idVals)
		if err != nil {
			return Target{}, err
		}
		port, err := single(HeaderSandboxPort, portVals)
		if err != nil {
			return Target{}, err
		}
		return target(id, port)
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, _ := strings.Cut(host, ".")
	portPart, idPart, ok := strings.Cut(label, "-")
	if !ok || portPart == "" || !allDigits(portPart) {
		return Target{}, ErrNoTarget
	}
	return target(idPart, portPart)
}

// single is a routing header's one value: present, not empty, and the same
// each time it is repeated.
func single(name string, vals []string) (string, error) {
	if len(vals) == 0 || vals[0] == "" {
		return "", fmt.Errorf("%w: missing header %s", ErrBadTarget, name)
	}
	for _, v := range vals[1:] {
		if v != vals[0] {
			return "", fmt.Errorf("%w: header %s is given more than once, with different values", ErrBadTarget, name)
		}
	}
	return vals[0], nil
}

func target(id, port string) (Target, error) {
	if !validID(id) {
		return Target{}, fmt.Errorf("%w: sandbox ID %q is not [a-z0-9]+", ErrBadTarget, truncate(id))
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return Target{}, fmt.Errorf("%w: port %q is not a port number", ErrBadTarget, truncate(port))
	}
	return Target{SandboxID: id, Port: uint16(p)}, nil
}

// BlockedEnvdPath reports whether path is one of envd's internal routes,
// which only the host may call and every edge refuses with 404.
func BlockedEnvdPath(path string) bool {
	switch strings.TrimRight(path, "/") {
	case "/init", "/freeze", "/unfreeze", "/collapse", "/fsfreeze", "/fsthaw", "/upgrade":
		return true
	}
	return false
}

// WriteSandboxNotFound answers a request for a sandbox that is unknown or
// gone as e2b's edge does: 502 with e2b's JSON, or an HTML page for a
// browser. The SDKs read a 502 as "the sandbox was killed or timed out".
func WriteSandboxNotFound(w http.ResponseWriter, r *http.Request, sandboxID string) {
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, "<!doctype html><title>Sandbox not found</title><h1>Sandbox not found</h1><p>The sandbox %s was not found: it may have been killed or timed out.</p>\n", html.EscapeString(sandboxID))
		return
	}
	wire.Write(w, wire.Error{SandboxID: sandboxID, Code: http.StatusBadGateway, Message: "The sandbox was not found"})
}

func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for i := range len(id) {
		if c := id[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > maxIDLen {
		return s[:maxIDLen] + "…"
	}
	return s
}
