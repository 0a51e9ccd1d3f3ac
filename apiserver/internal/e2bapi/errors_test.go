package e2bapi

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
)

// What failed is said without the addresses it failed at: a host's
// address in a backend error, and the connection's own in a body that
// could not be read, stay in the logs.
func TestAnswersNameNoAddress(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 213, 0, 9), Port: 27777}, Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"a host down", fmt.Errorf("get sandbox: %w", dial)},
		{"no capacity", fmt.Errorf("%w: %w", ErrCapacity, dial)},
		{"placement timeout", fmt.Errorf("%w: %w", ErrPlacementTimeout, dial)},
		{"a host that does not answer", fmt.Errorf("%w: %w", ErrUnavailable, dial)},
		{"cancelled", fmt.Errorf("%w: %w", context.Canceled, dial)},
	} {
		f, h := newTestServer(t)
		id := f.add(teamA, StateRunning, t0, nil)
		f.err = tc.err
		for _, r := range []struct{ method, path, body string }{
			{http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`},
			{http.MethodGet, "/sandboxes/" + id, ""},
			{http.MethodDelete, "/sandboxes/" + id, ""},
			{http.MethodPost, "/sandboxes/" + id + "/pause", ""},
			{http.MethodPost, "/v2/sandboxes/" + id + "/connect", `{"timeout":60}`},
			{http.MethodPost, "/sandboxes/" + id + "/timeout", `{"timeout":60}`},
			{http.MethodGet, "/v2/sandboxes", ""},
		} {
			rec := do(t, h, r.method, r.path, r.body, keyA)
			if rec.Code < 400 || strings.Contains(rec.Body.String(), "10.213.0.9") {
				t.Errorf("%s: %s %s = %d %s, want an error without the host's address", tc.name, r.method, r.path, rec.Code, rec.Body)
			}
		}
	}

	// A body whose connection failed midway.
	_, h := newTestServer(t)
	reset := &net.OpError{Op: "read", Net: "tcp", Source: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8080},
		Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 5555}, Err: syscall.ECONNRESET}
	req := httptest.NewRequest(http.MethodPost, "/v2/sandboxes", io.MultiReader(strings.NewReader(`{"templateID":`), failingReader{reset}))
	req.Header.Set("X-API-Key", keyA)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if e := wantError(t, rec, http.StatusBadRequest, "body"); strings.Contains(e.Message, "10.0.0.") {
		t.Errorf("a failed body read answers %q, which names the connection's addresses", e.Message)
	}
}

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

// A 503 for want of room names what could not be made: a host whose disk
// is below its reserve refuses snapshots, pauses and volumes too, and "no
// capacity for this sandbox" misled there.
func TestCapacityMessages(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	f.err = fmt.Errorf("host-b: this host's disk is nearly full: %w", ErrCapacity)
	for _, tc := range []struct{ method, path, body, want string }{
		{http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`, "no node has capacity for this sandbox now; retry later"},
		{http.MethodPost, "/volumes", `{"name":"work"}`, "no host has room for a new volume now; retry later"},
		{http.MethodPost, "/sandboxes/" + id + "/snapshots", `{}`, "the sandbox's host has no room for a snapshot now; retry later"},
		{http.MethodPost, "/sandboxes/" + id + "/pause", "", "the sandbox's host has no room to pause it now; retry later"},
		{http.MethodPost, "/sandboxes/" + id + "/fork", `{"count":1}`, "the sandbox's host has no room for a fork now; retry later"},
	} {
		e := wantError(t, do(t, h, tc.method, tc.path, tc.body, keyA), http.StatusServiceUnavailable)
		if e.Message != tc.want || e.ErrorCode != codeCapacity {
			t.Errorf("%s %s: %q (%s), want %q", tc.method, tc.path, e.Message, e.ErrorCode, tc.want)
		}
	}
}
