package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestCreateDefaults(t *testing.T) {
	for _, tc := range []struct {
		name        string
		path        string
		body        string
		wantTimeout time.Duration
		wantToken   bool
		wantSecure  bool
	}{
		{"v1 without secure", "/sandboxes", `{"templateID":"base"}`, 15 * time.Second, false, false},
		{"v1 secure as the SDKs send it", "/sandboxes", `{"templateID":"base","timeout":300,"secure":true,"allow_internet_access":true}`, 300 * time.Second, true, true},
		{"v2 minimal body", "/v2/sandboxes", `{"templateID":"base"}`, 300 * time.Second, true, true},
		{"v2 ignores secure=false", "/v2/sandboxes", `{"templateID":"base","secure":false,"timeout":60}`, 60 * time.Second, true, true},
		{"template trimmed", "/v2/sandboxes", `{"templateID":" base "}`, 300 * time.Second, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newTestServer(t)
			sb := wantSandbox(t, do(t, h, http.MethodPost, tc.path, tc.body, keyA), http.StatusCreated)
			if f.lastCreate.Timeout != tc.wantTimeout {
				t.Errorf("timeout = %v, want %v", f.lastCreate.Timeout, tc.wantTimeout)
			}
			if f.lastCreate.Secure != tc.wantSecure {
				t.Errorf("secure = %v, want %v", f.lastCreate.Secure, tc.wantSecure)
			}
			if (sb.EnvdAccessToken != "") != tc.wantToken {
				t.Errorf("envdAccessToken = %q, want one: %v", sb.EnvdAccessToken, tc.wantToken)
			}
			if sb.TemplateID != "base" || sb.ClientID != node || sb.EnvdVersion != "0.6.13" || !validID(sb.SandboxID) {
				t.Errorf("sandbox = %+v", sb)
			}
			if sb.Domain != nil || sb.TrafficAccessToken != nil {
				t.Errorf("domain = %v, trafficAccessToken = %v, want null", sb.Domain, sb.TrafficAccessToken)
			}
			if got := f.state(sb.SandboxID); got != StateRunning {
				t.Errorf("state = %q", got)
			}
		})
	}
}

func TestCreateFields(t *testing.T) {
	f, h := newTestServer(t)
	body := `{"templateID":"base-alias","timeout":60,"autoPause":true,"autoPauseMemory":false,
		"allow_internet_access":false,"metadata":{"user":"a b"},"envVars":{"FOO":"bar"},
		"mcp":null,"iam":{"tokens":{}},"volumeMounts":[],"network":{"allowPublicTraffic":true},
		"autoResume":{"enabled":false},"someFutureField":{"x":[1,2]}}`
	sb := wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes", body, keyA), http.StatusCreated)
	p := f.lastCreate
	if p.TemplateID != "base" || p.Alias != "base-alias" || sb.Alias != "base-alias" || sb.TemplateID != "base" {
		t.Errorf("template = %q alias %q; answer %+v", p.TemplateID, p.Alias, sb)
	}
	if !p.AutoPause || p.AutoPauseMemory || p.AllowInternetAccess == nil || *p.AllowInternetAccess {
		t.Errorf("params = %+v", p)
	}
	if p.Metadata["user"] != "a b" || p.EnvVars["FOO"] != "bar" {
		t.Errorf("metadata %v envVars %v", p.Metadata, p.EnvVars)
	}

	// Outbound rules and maskRequestHost pass as given; internet access is
	// the flag alone (nil when not said).
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["1.1.1.1","*.example.com"],"denyOut":["0.0.0.0/0"],"maskRequestHost":"custom.example.com:${PORT}"}}`, keyA), http.StatusCreated)
	if p := f.lastCreate; strings.Join(p.AllowOut, ",") != "1.1.1.1,*.example.com" || strings.Join(p.DenyOut, ",") != "0.0.0.0/0" ||
		p.MaskRequestHost != "custom.example.com:${PORT}" || p.AllowInternetAccess != nil {
		t.Errorf("network: params %+v", p)
	}
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`, keyA), http.StatusCreated)
	if p := f.lastCreate; p.AllowInternetAccess != nil || p.AllowOut != nil || p.DenyOut != nil || p.MaskRequestHost != "" {
		t.Errorf("nothing said: %+v", p)
	}
}

func TestCreateDomain(t *testing.T) {
	f := newFakeBackend()
	h := New(Config{Backend: f, Team: testTeam, SandboxDomain: "sandbox.example.com"})
	sb := wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes", `{"templateID":"base"}`, keyA), http.StatusCreated)
	if sb.Domain == nil || *sb.Domain != "sandbox.example.com" {
		t.Fatalf("domain = %v", sb.Domain)
	}
	// A running sandbox's detail names it; a paused one's does not, as
	// e2b's.
	running, paused := f.add(teamA, StateRunning, t0, nil), f.add(teamA, StatePaused, t0, nil)
	for id, want := range map[string]bool{running: true, paused: false} {
		var d struct{ Domain *string }
		if err := json.Unmarshal(do(t, h, http.MethodGet, "/sandboxes/"+id, "", keyA).Body.Bytes(), &d); err != nil || (d.Domain != nil) != want {
			t.Errorf("GET of a sandbox (running %v): domain %v, %v", want, d.Domain, err)
		}
	}
}

// Every validation answers 400 naming the field, and nothing reaches a host.
func TestCreateInvalid(t *testing.T) {
	long := strings.Repeat("k", 65)
	for _, tc := range []struct {
		name, body string
		status     int
		field      string
	}{
		{"not JSON", `{"templateID":`, 400, "body"},
		{"garbage", `templateID=base`, 400, "body"},
		{"array body", `[]`, 400, "body"},
		{"two values", `{"templateID":"base"}{}`, 400, "body"},
		{"missing templateID", `{}`, 400, "templateID"},
		{"empty body", ``, 400, "templateID"},
		{"empty templateID", `{"templateID":""}`, 400, "templateID"},
		{"templateID not a string", `{"templateID":7}`, 400, "templateID"},
		{"unknown template", `{"templateID":"nope"}`, 404, "template 'nope' not found"},
		{"long templateID", `{"templateID":"` + strings.Repeat("a", 300) + `"}`, 400, "templateID"},
		{"timeout string", `{"templateID":"base","timeout":"300"}`, 400, "timeout"},
		{"timeout fraction", `{"templateID":"base","timeout":1.5}`, 400, "timeout"},
		{"timeout negative", `{"templateID":"base","timeout":-1}`, 400, "timeout"},
		{"timeout zero", `{"templateID":"base","timeout":0}`, 400, "timeout"},
		{"timeout above max", `{"templateID":"base","timeout":86401}`, 400, "timeout"},
		{"timeout huge", `{"templateID":"base","timeout":1e300}`, 400, "timeout"},
		{"timeout beyond int64", `{"templateID":"base","timeout":99999999999999999999}`, 400, "timeout"},
		{"secure not bool", `{"templateID":"base","secure":"yes"}`, 400, "secure"},
		{"autoPause not bool", `{"templateID":"base","autoPause":1}`, 400, "autoPause"},
		{"allow_internet_access not bool", `{"templateID":"base","allow_internet_access":"no"}`, 400, "allow_internet_access"},
		{"metadata not an object", `{"templateID":"base","metadata":[]}`, 400, "metadata"},
		{"metadata value not a string", `{"templateID":"base","metadata":{"a":1}}`, 400, "metadata"},
		{"metadata 9 entries", `{"templateID":"base","metadata":{"a":"","b":"","c":"","d":"","e":"","f":"","g":"","h":"","i":""}}`, 400, "metadata"},
		{"metadata key 65 bytes", `{"templateID":"base","metadata":{"` + long + `":""}}`, 400, "metadata"},
		{"metadata 193 bytes", `{"templateID":"base","metadata":{"k":"` + strings.Repeat("v", 192) + `"}}`, 400, "metadata"},
		{"metadata empty key", `{"templateID":"base","metadata":{"":"v"}}`, 400, "metadata"},
		{"envVars not an object", `{"templateID":"base","envVars":"A=1"}`, 400, "envVars"},
		{"envVars name with =", `{"templateID":"base","envVars":{"A=B":"1"}}`, 400, "envVars"},
		{"envVars NUL", `{"templateID":"base","envVars":{"A":"\u0000"}}`, 400, "envVars"},
		{"network not an object", `{"templateID":"base","network":true}`, 400, "network"},
		{"network.allowOut not strings", `{"templateID":"base","network":{"allowOut":[1]}}`, 400, "network.allowOut"},
		{"autoResume not an object", `{"templateID":"base","autoResume":true}`, 400, "autoResume"},
		{"autoResume.enabled not bool", `{"templateID":"base","autoResume":{"enabled":"yes"}}`, 400, "autoResume"},
		{"allowPublicTraffic not bool", `{"templateID":"base","network":{"allowPublicTraffic":"no"}}`, 400, "network.allowPublicTraffic"},
		{"volumeMounts not an array", `{"templateID":"base","volumeMounts":{}}`, 400, "volumeMounts"},
		{"too large", `{"templateID":"base","envVars":{"A":"` + strings.Repeat("x", maxBodyBytes) + `"}}`, 413, "body"},

		{"autoPauseMemory false without autoPause", `{"templateID":"base","autoPauseMemory":false}`, 400, "autoPauseMemory=false only applies when autoPause is true."},
		{"autoPauseMemory false with autoResume", `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400, "cannot be combined with autoResume"},

		{"mcp", `{"templateID":"base","mcp":{"exa":{}}}`, 501, "mcp"},
		// e2b's checks and words (infra's validateNetworkConfig).
		{"a domain in denyOut", `{"templateID":"base","network":{"denyOut":["example.com"]}}`, 400, "invalid denied CIDR example.com"},
		{"ALL_TRAFFIC as a word", `{"templateID":"base","network":{"denyOut":["ALL_TRAFFIC"]}}`, 400, "invalid denied CIDR ALL_TRAFFIC"},
		{"an unspecified address", `{"templateID":"base","network":{"allowOut":["0.0.0.0"]}}`, 400, "invalid allowed address 0.0.0.0"},
		{"0.0.0.0/8 denied", `{"templateID":"base","network":{"denyOut":["0.0.0.0/8"]}}`, 400, "invalid denied CIDR 0.0.0.0/8"},
		{"a domain without a deny of all", `{"templateID":"base","network":{"allowOut":["example.com"],"denyOut":["10.0.0.0/8"]}}`, 400, "must include 'ALL_TRAFFIC' in deny out"},
		{"internet off does not stand for ALL_TRAFFIC", `{"templateID":"base","allow_internet_access":false,"network":{"allowOut":["example.com"]}}`, 400, "must include 'ALL_TRAFFIC'"},
		{"mask host not a host", `{"templateID":"base","network":{"maskRequestHost":"a:b:c"}}`, 400, "mask request host is not valid: a:b:c"},
		{"mask host not ASCII", `{"templateID":"base","network":{"maskRequestHost":"bücher.example:${PORT}"}}`, 400, "mask request host 'bücher.example' is not ASCII"},
		{"mask host long", `{"templateID":"base","network":{"maskRequestHost":"` + strings.Repeat("a", 256) + `"}}`, 400, "mask request host is not valid"},
		{"egress proxy", `{"templateID":"base","network":{"egressProxy":{"address":"p:1080"}}}`, 501, "egressProxy"},
		{"rules", `{"templateID":"base","network":{"rules":{"a.com":[]}}}`, 501, "network.rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
				f, h := newTestServer(t)
				wantError(t, do(t, h, http.MethodPost, path, tc.body, keyA), tc.status, tc.field)
				if n := f.hostCalls(); n != 0 {
					t.Fatalf("%s: %d backend calls reached a host", path, n)
				}
			}
		})
	}
}

// As e2b's: a private sandbox (no public traffic) must be secure; v2's
// always are.
func TestCreatePrivateNeedsSecure(t *testing.T) {
	f, h := newTestServer(t)
	wantError(t, do(t, h, http.MethodPost, "/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false}}`, keyA),
		400, "You cannot create a sandbox without public access unless you enable secure envd access")
	if n := f.hostCalls(); n != 0 {
		t.Fatalf("%d backend calls reached a host", n)
	}
	wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes", `{"templateID":"base","secure":true,"network":{"allowPublicTraffic":false}}`, keyA), http.StatusCreated)
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false}}`, keyA), http.StatusCreated)
}

// The metadata bounds are the NodeInventory CRD's: the largest allowed
// metadata passes.
func TestCreateMetadataAtBounds(t *testing.T) {
	_, h := newTestServer(t)
	md := map[string]string{strings.Repeat("k", 64): strings.Repeat("v", 192-64)}
	b, _ := json.Marshal(map[string]any{"templateID": "base", "metadata": md})
	wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes", string(b), keyA), http.StatusCreated)
	md = map[string]string{}
	for i := range 8 {
		md[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 22)
	}
	b, _ = json.Marshal(map[string]any{"templateID": "base", "metadata": md})
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", string(b), keyA), http.StatusCreated)
}

func TestBackendErrors(t *testing.T) {
	for _, tc := range []struct {
		err       error
		status    int
		errorCode string
	}{
		{fmt.Errorf("team %s has 20 sandboxes: %w", teamA, ErrRateLimited), 429, ""},
		{fmt.Errorf("no node fits 2 CPUs: %w", ErrCapacity), 503, codeCapacity},
		{fmt.Errorf("place: %w", ErrPlacementTimeout), 504, codePlacementTimeout},
		{fmt.Errorf("gvisor: %w", ErrUnsupported), 501, ""},
		{fmt.Errorf("get sandbox on node host-b: %w: dial tcp 10.0.0.9:27777: connection refused", ErrUnavailable), 503, codeHostUnavailable},
		{Invalid("envVars", "too many"), 400, ""},
		{errors.New("dial sandboxd: connection refused"), 500, codeInternal},
		{&VolumeHostError{Volumes: []string{"work"}, Hosts: []string{"host-b"}, Err: fmt.Errorf("%w: dial tcp 10.0.0.9:27777: connection refused", ErrUnavailable)}, 503, codeHostUnavailable},
		{&VolumeHostError{Volumes: []string{"a", "b"}, Hosts: []string{"host-a"}, Err: fmt.Errorf("no node fits 2 CPUs: %w", ErrCapacity)}, 503, codeCapacity},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			f, h := newTestServer(t)
			f.err = tc.err
			e := wantError(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`, keyA), tc.status)
			if e.ErrorCode != tc.errorCode {
				t.Errorf("error_code = %q, want %q", e.ErrorCode, tc.errorCode)
			}
			// A volume's host is named, with the volume, and nothing else.
			if vh := new(VolumeHostError); errors.As(tc.err, &vh) {
				if e.Message != vh.Message() || !strings.Contains(e.Message, vh.Hosts[0]) || !strings.Contains(e.Message, "'"+vh.Volumes[0]+"'") {
					t.Errorf("message = %q, want one naming the volumes and hosts", e.Message)
				}
				return
			}
			if tc.status >= 500 && tc.status != 501 && strings.Contains(e.Message, tc.err.Error()) {
				t.Errorf("%d leaks the backend's error: %q", tc.status, e.Message)
			}
		})
	}
}

// sandboxRoutes are the routes that act on one sandbox, with a valid body.
var sandboxRoutes = []struct{ method, path, body string }{
	{http.MethodGet, "/sandboxes/%s", ""},
	{http.MethodDelete, "/sandboxes/%s", ""},
	{http.MethodPost, "/sandboxes/%s/connect", `{"timeout":60}`},
	{http.MethodPost, "/v2/sandboxes/%s/connect", `{}`},
	{http.MethodPost, "/sandboxes/%s/timeout", `{"timeout":60}`},
	{http.MethodPost, "/sandboxes/%s/refreshes", `{"duration":60}`},
	{http.MethodPost, "/sandboxes/%s/pause", `{}`},
	{http.MethodPost, "/sandboxes/%s/resume", `{}`},
	{http.MethodGet, "/sandboxes/%s/metrics", ""},
	{http.MethodGet, "/sandboxes/%s/logs", ""},
	{http.MethodGet, "/v2/sandboxes/%s/logs", ""},
	{http.MethodPut, "/sandboxes/%s/network", `{}`},
}

// emptyWhenGone are the routes whose answer for a sandbox the team has
// not is empty, as e2b's (its logs and metrics outlive the sandbox).
var emptyWhenGone = map[string]string{
	"/sandboxes/%s/metrics": `[]`,
	"/sandboxes/%s/logs":    `{"logs":[],"logEntries":[]}`,
	"/v2/sandboxes/%s/logs": `{"logs":[]}`,
}

// Another team's sandbox answers exactly like a missing one, on every
// route, and is left untouched: a 404, or for its logs and metrics an
// empty answer.
func TestOtherTeamIsNotFound(t *testing.T) {
	for _, rt := range sandboxRoutes {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			f, h := newTestServer(t)
			theirs := f.add(teamB, StatePaused, t0, nil)
			missing := "zzzzzzzzzzzzzzzzzzzz"
			if empty, ok := emptyWhenGone[rt.path]; ok {
				f.metrics[theirs] = []Metric{{Timestamp: t0, CPUCount: 2}}
				for _, id := range []string{theirs, missing} {
					rec := do(t, h, rt.method, fmt.Sprintf(rt.path, id), rt.body, keyA)
					if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != empty {
						t.Fatalf("%s of %s: %d %s; want 200 %s", rt.path, id, rec.Code, rec.Body, empty)
					}
				}
				return
			}
			a := wantError(t, do(t, h, rt.method, fmt.Sprintf(rt.path, theirs), rt.body, keyA), 404, theirs)
			b := wantError(t, do(t, h, rt.method, fmt.Sprintf(rt.path, missing), rt.body, keyA), 404, missing)
			if strings.ReplaceAll(a.Message, theirs, "ID") != strings.ReplaceAll(b.Message, missing, "ID") {
				t.Fatalf("another team's sandbox answers %q, a missing one %q", a.Message, b.Message)
			}
			if f.state(theirs) != StatePaused {
				t.Fatal("another team's sandbox changed")
			}
		})
	}
}

// A malformed ID is a 404 that never reaches the backend.
func TestMalformedIDIsNotFound(t *testing.T) {
	for _, rt := range sandboxRoutes {
		for _, id := range []string{"short", "ABCDEFGHIJKLMNOPQRST", "abcdefghijklmnopqrs%2E", strings.Repeat("a", 200)} {
			f, h := newTestServer(t)
			wantError(t, do(t, h, rt.method, fmt.Sprintf(rt.path, id), rt.body, keyA), 404, "not found")
			if n := f.hostCalls(); n != 0 {
				t.Fatalf("%s %s: backend called", rt.method, id)
			}
		}
	}
}

// Old SDKs address a sandbox as "<sandboxID>-<clientID>".
func TestLegacyIDWithClientID(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	wantStatus(t, do(t, h, http.MethodGet, "/sandboxes/"+id+"-6532622b", "", keyA), http.StatusOK)
}

func TestUnauthenticated(t *testing.T) {
	routes := append([]struct{ method, path, body string }{
		{http.MethodPost, "/sandboxes", `{"templateID":"base"}`},
		{http.MethodPost, "/v2/sandboxes", `{"templateID":"base"}`},
		{http.MethodGet, "/sandboxes", ""},
		{http.MethodGet, "/v2/sandboxes", ""},
		{http.MethodGet, "/sandboxes/metrics?sandbox_ids=x", ""},
		{http.MethodGet, "/templates", ""},
		{http.MethodGet, "/v2/templates", ""},
		{http.MethodGet, "/templates/base", ""},
		{http.MethodGet, "/templates/aliases/base", ""},
		{http.MethodPost, "/sandboxes/%s/fork", "{}"},
	}, sandboxRoutes...)
	for _, key := range []string{"", "e2b_0000000000000000000000000000000000000000"} {
		for _, rt := range routes {
			f, h := newTestServer(t)
			id := f.add(teamA, StateRunning, t0, nil)
			path := rt.path
			if strings.Contains(path, "%s") {
				path = fmt.Sprintf(path, id)
			}
			wantError(t, do(t, h, rt.method, path, rt.body, key), 401, "API key")
			if n := f.hostCalls() + f.count("Template") + f.count("Templates"); n != 0 {
				t.Fatalf("%s %s: backend called without a team", rt.method, rt.path)
			}
		}
	}
}

func TestGet(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StatePaused, t0, map[string]string{"user": "u1"})
	rec := do(t, h, http.MethodGet, "/sandboxes/"+id, "", keyA)
	wantStatus(t, rec, http.StatusOK)
	checkKeys(t, "SandboxDetail", keysOf(t, rec.Body.Bytes()), detailRequired, detailOptional)
	var got sandboxDetailJSON
	strictDecode(t, rec.Body.Bytes(), &got)
	if got.SandboxID != id || got.State != StatePaused || got.ClientID != node || got.CPUCount != 2 ||
		got.MemoryMB != 512 || got.DiskSizeMB != 1024 || !got.StartedAt.Equal(t0) || got.Metadata["user"] != "u1" ||
		got.Lifecycle.OnTimeout != "kill" || got.VolumeMounts == nil || got.EnvdAccessToken != "tok-"+id {
		t.Fatalf("detail = %+v", got)
	}
	// As e2b's, the alias is the template's first (the SDK's info.name),
	// in a list too.
	if got.Alias != "base-alias" {
		t.Errorf("alias = %q, want the template's first, base-alias", got.Alias)
	}
	rec = do(t, h, http.MethodGet, "/v2/sandboxes?state=paused", "", keyA)
	wantStatus(t, rec, http.StatusOK)
	var listed []struct{ SandboxID, Alias string }
	if err := json.Unmarshal(rec.Body.Bytes(), &listed); err != nil || len(listed) != 1 || listed[0].Alias != "base-alias" {
		t.Errorf("listed %s (%v), want the sandbox with alias base-alias", rec.Body.Bytes(), err)
	}
}

func TestKill(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	rec := do(t, h, http.MethodDelete, "/sandboxes/"+id, "", keyA)
	wantStatus(t, rec, http.StatusNoContent)
	if rec.Body.Len() != 0 {
		t.Fatalf("204 with a body: %q", rec.Body.String())
	}
	wantError(t, do(t, h, http.MethodDelete, "/sandboxes/"+id, "", keyA), 404, id)
}

func TestConnect(t *testing.T) {
	f, h := newTestServer(t)
	running := f.add(teamA, StateRunning, t0, nil) // ends t0+5m
	paused := f.add(teamA, StatePaused, t0, nil)

	// Running: 200, and the TTL is only extended.
	sb := wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes/"+running+"/connect", `{"timeout":60}`, keyA), http.StatusOK)
	if sb.SandboxID != running || sb.EnvdAccessToken != "tok-"+running {
		t.Fatalf("connect = %+v", sb)
	}
	if got := f.endAt(running); !got.Equal(t0.Add(5 * time.Minute)) {
		t.Fatalf("connect shortened the TTL to %v", got)
	}
	// Paused: 201, resumed.
	wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes/"+paused+"/connect", `{"timeout":600,"memory":true}`, keyA), http.StatusCreated)
	if f.state(paused) != StateRunning || !f.endAt(paused).Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("paused sandbox not resumed for 600 s")
	}

	// v2: the body is optional and the timeout defaults to 300 s.
	paused2 := f.add(teamA, StatePaused, t0, nil)
	for _, body := range []string{"", "{}", "null"} {
		wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes/"+running+"/connect", body, keyA), http.StatusOK)
		if f.lastTimeout != 300*time.Second {
			t.Fatalf("v2 connect %q: timeout %v", body, f.lastTimeout)
		}
	}
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes/"+paused2+"/connect", "{}", keyA), http.StatusCreated)

	// v1: the timeout is required.
	for _, tc := range []struct{ body, field string }{
		{``, "timeout"}, {`{}`, "timeout"}, {`{"timeout":null}`, "timeout"},
		{`{"timeout":"5"}`, "timeout"}, {`{"timeout":100000}`, "timeout"}, {`{"timeout":5,"memory":"no"}`, "memory"},
		// Negative: e2b's OpenAPI validation (minimum 0) refuses it.
		{`{"timeout":-5}`, "timeout"},
	} {
		n := f.hostCalls()
		wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+running+"/connect", tc.body, keyA), 400, tc.field)
		if f.hostCalls() != n {
			t.Fatalf("invalid connect %q reached the backend", tc.body)
		}
	}
	wantError(t, do(t, h, http.MethodPost, "/v2/sandboxes/"+running+"/connect", `{"timeout":-1}`, keyA), 400, "timeout")

	// As in e2b's API, a timeout of 0 leaves a running sandbox's end as it
	// is; it cannot resume a paused one.
	end := f.endAt(running)
	for _, path := range []string{"/sandboxes/", "/v2/sandboxes/"} {
		f.lastTimeout = time.Hour
		wantSandbox(t, do(t, h, http.MethodPost, path+running+"/connect", `{"timeout":0}`, keyA), http.StatusOK)
		if f.lastTimeout != 0 || !f.endAt(running).Equal(end) || f.state(running) != StateRunning {
			t.Fatalf("%sconnect with timeout 0: the backend got %v, and the end moved from %v to %v", path, f.lastTimeout, end, f.endAt(running))
		}
	}
	paused3 := f.add(teamA, StatePaused, t0, nil)
	wantError(t, do(t, h, http.MethodPost, "/v2/sandboxes/"+paused3+"/connect", `{"timeout":0}`, keyA), 400, "timeout", "greater than 0")
	if f.state(paused3) != StatePaused {
		t.Fatal("connect with timeout 0 resumed a paused sandbox")
	}
}

func TestSetTimeoutAndRefresh(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/timeout", `{"timeout":30}`, keyA), http.StatusNoContent)
	if f.lastTimeout != 30*time.Second || f.lastExtend || !f.endAt(id).Equal(t0.Add(30*time.Second)) {
		t.Fatalf("setTimeout: %v extend=%v end %v", f.lastTimeout, f.lastExtend, f.endAt(id))
	}
	for _, body := range []string{``, `{}`, `{"timeout":-1}`, `{"timeout":"1"}`} {
		wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/timeout", body, keyA), 400, "timeout")
		if !f.endAt(id).Equal(t0.Add(30 * time.Second)) {
			t.Fatalf("timeout %s moved the end", body)
		}
	}
	// As in e2b's API, a timeout past the longest is cut to it.
	other := f.add(teamA, StateRunning, t0, nil)
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+other+"/timeout", `{"timeout":172800}`, keyA), http.StatusNoContent)
	if f.lastTimeout != 24*time.Hour {
		t.Fatalf("setTimeout of 48 h: the backend got %v, want 24h", f.lastTimeout)
	}
	// As in e2b's API, 0 ends the sandbox now (killed; paused with
	// auto-pause).
	autoPause := f.add(teamA, StateRunning, t0, nil)
	f.sandboxes[autoPause].sb.AutoPause = true
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/timeout", `{"timeout":0}`, keyA), http.StatusNoContent)
	if f.lastTimeout != 0 || f.lastExtend {
		t.Fatalf("timeout 0: the backend got %v extend=%v", f.lastTimeout, f.lastExtend)
	}
	wantError(t, do(t, h, http.MethodGet, "/sandboxes/"+id, "", keyA), http.StatusNotFound, id)
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+autoPause+"/timeout", `{"timeout":0}`, keyA), http.StatusNoContent)
	if f.lastTimeout != 0 || f.state(autoPause) != StatePaused {
		t.Fatalf("timeout 0 with auto-pause: the backend got %v, the sandbox is %s", f.lastTimeout, f.state(autoPause))
	}
	id = f.add(teamA, StateRunning, t0, nil)

	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/refreshes", ``, keyA), http.StatusNoContent)
	if f.lastTimeout != 15*time.Second || !f.lastExtend {
		t.Fatalf("refresh default: %v extend=%v", f.lastTimeout, f.lastExtend)
	}
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/refreshes", `{"duration":3}`, keyA), http.StatusNoContent)
	if f.lastTimeout != 15*time.Second {
		t.Fatalf("refresh of 3 s: %v, want e2b's least, 15 s", f.lastTimeout)
	}
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/refreshes", `{"duration":3600}`, keyA), http.StatusNoContent)
	for _, body := range []string{`{"duration":3601}`, `{"duration":-1}`, `{"duration":true}`} {
		wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/refreshes", body, keyA), 400, "duration")
	}
}

func TestPause(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/pause", `{"memory":false}`, keyA), http.StatusNoContent)
	if f.state(id) != StatePaused || f.lastKeep {
		t.Fatalf("state %q keepMemory %v", f.state(id), f.lastKeep)
	}
	e := wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/pause", ``, keyA), http.StatusConflict, "already paused")
	if want := "Error pausing sandbox - sandbox '" + id + "' is already paused"; e.Message != want {
		t.Errorf("409 says %q, want e2b's %q", e.Message, want)
	}
	if !f.lastKeep {
		t.Fatal("memory defaults to true")
	}
	wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/pause", `{"memory":1}`, keyA), 400, "memory")

	// Other refusals are not 409: the SDK's pause() would return false
	// while the sandbox runs on, or is gone.
	running := f.add(teamA, StateRunning, t0, nil)
	f.err = Invalid("", "Sandbox cannot be paused: its files do not fit")
	e = wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+running+"/pause", ``, keyA), http.StatusBadRequest, "do not fit")
	if e.Message != "Sandbox cannot be paused: its files do not fit" {
		t.Errorf("400 says %q, want the host's reason as it is", e.Message)
	}
	f.err = fmt.Errorf("pause: %w", ErrNotFound)
	wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+running+"/pause", ``, keyA), http.StatusNotFound, running)
}

func TestResume(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StatePaused, t0, nil)
	sb := wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/resume", `{"autoPause":false}`, keyA), http.StatusCreated)
	if sb.SandboxID != id || f.state(id) != StateRunning || f.lastTimeout != 15*time.Second {
		t.Fatalf("resume: %+v state %q timeout %v", sb, f.state(id), f.lastTimeout)
	}
	wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/resume", `{}`, keyA), http.StatusConflict, "already running")
	wantError(t, do(t, h, http.MethodPost, "/sandboxes/"+id+"/resume", `{"timeout":-3}`, keyA), 400, "timeout")
}

func TestMaxTimeoutConfig(t *testing.T) {
	f := newFakeBackend()
	h := New(Config{Backend: f, Team: testTeam, MaxTimeout: time.Hour, Logger: discard})
	wantError(t, do(t, h, http.MethodPost, "/sandboxes", `{"templateID":"base","timeout":3601}`, keyA), 400, "timeout", "3600")
	wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes", `{"templateID":"base","timeout":3600}`, keyA), http.StatusCreated)
}

func TestPanicIsJSON500(t *testing.T) {
	h := New(Config{Backend: panicBackend{newFakeBackend()}, Team: testTeam, Logger: discard})
	wantError(t, do(t, h, http.MethodGet, "/sandboxes", "", keyA), 500, "internal")
}

type panicBackend struct{ *fakeBackend }

func (panicBackend) List(context.Context, string, []State) ([]Sandbox, error) { panic("boom") }

// PUT /sandboxes/{id}/network: e2b's checks on the body before the sandbox
// is looked up, 204 with the rules replaced whole, internet access changed
// only when sent, 404 for a paused sandbox (as in e2b), 501 for what Skiff
// does not do.
func TestUpdateNetwork(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	put := func(id, body string) *httptest.ResponseRecorder {
		return do(t, h, http.MethodPut, "/sandboxes/"+id+"/network", body, keyA)
	}
	wantStatus(t, put(id, `{"allowOut":["1.1.1.1","*.example.com"],"denyOut":["0.0.0.0/0"]}`), http.StatusNoContent)
	rec := do(t, h, http.MethodGet, "/sandboxes/"+id, "", keyA)
	var got sandboxDetailJSON
	strictDecode(t, rec.Body.Bytes(), &got)
	if got.Network == nil || strings.Join(got.Network.AllowOut, ",") != "1.1.1.1,*.example.com" || strings.Join(got.Network.DenyOut, ",") != "0.0.0.0/0" {
		t.Errorf("after the update, network = %+v", got.Network)
	}
	wantStatus(t, put(id, `{"allow_internet_access":false}`), http.StatusNoContent)
	rec = do(t, h, http.MethodGet, "/sandboxes/"+id, "", keyA)
	got = sandboxDetailJSON{}
	strictDecode(t, rec.Body.Bytes(), &got)
	if got.Network != nil && (got.Network.AllowOut != nil || got.Network.DenyOut != nil) || got.AllowInternetAccess == nil || *got.AllowInternetAccess {
		t.Errorf("after {allow_internet_access:false}: network %+v, allowInternetAccess %v", got.Network, got.AllowInternetAccess)
	}
	wantStatus(t, put(id, `{}`), http.StatusNoContent)
	if sb := f.sandboxes[id].sb; sb.AllowInternetAccess == nil || *sb.AllowInternetAccess {
		t.Error("{} changed internet access")
	}

	calls := f.count("UpdateNetwork")
	for _, tc := range []struct{ body, want string }{
		{`{"denyOut":["example.com"]}`, "invalid denied CIDR example.com"},
		{`{"allowOut":["example.com"]}`, "must include 'ALL_TRAFFIC' in deny out"},
		{`{"allowOut":"1.1.1.1"}`, "allowOut"},
	} {
		// Checked before the lookup: a missing sandbox answers the same.
		for _, target := range []string{id, "zzzzzzzzzzzzzzzzzzzz"} {
			wantError(t, put(target, tc.body), http.StatusBadRequest, tc.want)
		}
	}
	wantError(t, put(id, `{"egressProxy":{"address":"proxy.example.com:1080"}}`), http.StatusNotImplemented, "egressProxy")
	wantError(t, put(id, `{"rules":{"a.example.com":[{"transform":{"headers":{"X":"y"}}}]}}`), http.StatusNotImplemented, "rules")
	if n := f.count("UpdateNetwork"); n != calls {
		t.Errorf("refused bodies reached the backend %d times", n-calls)
	}
	wantStatus(t, put(id, `{"rules":{}}`), http.StatusNoContent)

	paused := f.add(teamA, StatePaused, t0, nil)
	wantError(t, put(paused, `{}`), http.StatusNotFound, paused)
}
