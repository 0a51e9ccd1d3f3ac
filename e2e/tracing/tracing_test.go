// Package tracing checks the whole system's traces: started as `make up`
// starts it, with OTEL_EXPORTER_OTLP_ENDPOINT pointing at an OTLP/HTTP
// receiver in the test, a create through the e2b API is one trace across
// sandbox-apiserver and sandboxd, and a request through the envd proxy one
// across sandbox-envd-proxy and sandboxd's relay.
package tracing

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
)

// span is what the receiver keeps of one span.
type span struct {
	traceID, spanID, parentID string
	service, name             string
	attrs                     map[string]string // the string-valued ones
}

// receiver is an OTLP/HTTP trace receiver (POST /v1/traces, protobuf) that
// keeps every span in memory.
type receiver struct {
	mu    sync.Mutex
	spans []span
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []span
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := span{
					traceID: hex.EncodeToString(s.GetTraceId()), spanID: hex.EncodeToString(s.GetSpanId()),
					parentID: hex.EncodeToString(s.GetParentSpanId()), service: service, name: s.GetName(),
					attrs: make(map[string]string),
				}
				for _, kv := range s.GetAttributes() {
					if v := kv.GetValue().GetStringValue(); v != "" {
						sp.attrs[kv.GetKey()] = v
					}
				}
				got = append(got, sp)
			}
		}
	}
	rc.mu.Lock()
	rc.spans = append(rc.spans, got...)
	rc.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// trace returns the spans of one trace.
func (rc *receiver) trace(id string) []span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []span
	for _, s := range rc.spans {
		if s.traceID == id {
			out = append(out, s)
		}
	}
	return out
}

// find returns the first span that match accepts.
func (rc *receiver) find(match func(span) bool) (span, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, s := range rc.spans {
		if match(s) {
			return s, true
		}
	}
	return span{}, false
}

func (rc *receiver) all() []span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.spans)
}

func startReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{}
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return rc, "http://" + ln.Addr().String()
}

// has reports whether spans hold one of service named name.
func has(spans []span, service, name string) bool {
	return slices.ContainsFunc(spans, func(s span) bool { return s.service == service && s.name == name })
}

// byID indexes spans by span ID.
func byID(spans []span) map[string]span {
	m := make(map[string]span, len(spans))
	for _, s := range spans {
		m[s.spanID] = s
	}
	return m
}

// childOf reports whether the span of service named name has a parent
// span of parentService in the same trace: the context crossed the hop.
func childOf(spans []span, service, name, parentService string) bool {
	ids := byID(spans)
	for _, s := range spans {
		if s.service == service && s.name == name {
			if p, ok := ids[s.parentID]; ok && p.service == parentService {
				return true
			}
		}
	}
	return false
}

func describe(spans []span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "\n  %s %s/%s parent %s", s.traceID[:8], s.service, s.name, s.parentID)
	}
	return b.String()
}

func TestCreateAndProxyTraces(t *testing.T) {
	rc, endpoint := startReceiver(t)
	sys := systemtest.StartWith(t, systemtest.Options{Env: []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
		"OTEL_BSP_SCHEDULE_DELAY=100", // ms: spans reach the receiver a tenth of a second after they end
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
	}}, "team-a")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	key := sys.Keys["team-a"]

	// A create through the e2b API, as an SDK makes it.
	var created struct{ SandboxID, EnvdAccessToken string }
	status, body := call(ctx, t, http.MethodPost, sys.APIURL+"/sandboxes", key, `{"templateID":"base","timeout":300}`, nil)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	if err := json.Unmarshal(body, &created); err != nil || created.SandboxID == "" {
		t.Fatalf("create answered %s: %v", body, err)
	}
	id := created.SandboxID

	// One request through the proxy into the sandbox's envd.
	status, body = call(ctx, t, http.MethodGet, sys.SandboxURL+"/health", "", "", http.Header{
		"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {created.EnvdAccessToken},
	})
	if status/100 != 2 {
		t.Fatalf("GET /health through the proxy: %d %s", status, body)
	}

	if status, body = call(ctx, t, http.MethodDelete, sys.APIURL+"/sandboxes/"+id, key, "", nil); status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", status, body)
	}

	// The create: sandboxd's sandbox.launch of this sandbox, in a trace
	// that the apiserver began with the request and its placement, the
	// sandboxd RPC's server span a child of the apiserver's client span.
	var createTrace, proxyTrace []span
	waitFor(ctx, t, rc, "trace of the create across sandbox-apiserver and sandboxd", func() bool {
		launch, ok := rc.find(func(s span) bool {
			return s.service == "sandboxd" && s.name == "sandbox.launch" && s.attrs["skiff.sandbox.id"] == id
		})
		if !ok {
			return false
		}
		createTrace = rc.trace(launch.traceID)
		return has(createTrace, "sandbox-apiserver", "POST /sandboxes") && has(createTrace, "sandbox-apiserver", "placement") &&
			has(createTrace, "sandboxd", "envd.init") && has(createTrace, "sandboxd", "envd /init") &&
			childOf(createTrace, "sandboxd", "skiff.sandboxd.v1.SandboxdService/Create", "sandbox-apiserver")
	})

	// The proxied request: the proxy's span and sandboxd's relay in one
	// trace, the relay's server span a child of the proxy's client span.
	waitFor(ctx, t, rc, "trace of the proxied request across sandbox-envd-proxy and sandboxd", func() bool {
		proxied, ok := rc.find(func(s span) bool { return s.service == "sandbox-envd-proxy" && s.name == "proxy" })
		if !ok {
			return false
		}
		proxyTrace = rc.trace(proxied.traceID)
		return childOf(proxyTrace, "sandboxd", "relay", "sandbox-envd-proxy") && has(proxyTrace, "sandboxd", "relay to sandbox")
	})
	t.Logf("the create's trace:%s\nthe proxied request's:%s", describe(createTrace), describe(proxyTrace))

	// sandboxd's log line of the start carries the create's trace ID.
	log, err := os.ReadFile(filepath.Join(sys.LogDir(), "sandboxd.log"))
	if err != nil {
		t.Fatal(err)
	}
	var started bool
	for line := range strings.SplitSeq(string(log), "\n") {
		if strings.Contains(line, `msg="sandbox started"`) && strings.Contains(line, "sandbox="+id) {
			started = true
			if !strings.Contains(line, "trace_id="+createTrace[0].traceID) {
				t.Errorf("sandboxd's start line lacks the create's trace_id %s:\n%s", createTrace[0].traceID, line)
			}
		}
	}
	if !started {
		t.Errorf("no \"sandbox started\" line for %s in sandboxd's log", id)
	}
}

// waitFor polls ok until it holds, failing the test with what the
// receiver holds when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, rc *receiver, what string, ok func() bool) {
	t.Helper()
	deadline, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !ok() {
		select {
		case <-deadline.Done():
			t.Fatalf("found no %s within 30s; the receiver holds:%s", what, describe(rc.all()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// call sends a request with the team's API key (when key is set) and
// returns the status and body.
func call(ctx context.Context, t *testing.T, method, url, key, body string, h http.Header) (int, []byte) {
	t.Helper()
	var rd io.Reader = http.NoBody
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s %s: timed out", method, url)
		}
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}
