package routing

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		host    string
		headers map[string]string
		want    Target
		wantErr error
	}{
		{"headers", "127.0.0.1:3002", map[string]string{HeaderSandboxID: "abc123", HeaderSandboxPort: "49983"}, Target{"abc123", 49983}, nil},
		{"headers win over host", "8080-other.example.com", map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "3000"}, Target{"abc", 3000}, nil},
		{"host", "49983-iabc123.sandbox.example.com", nil, Target{"iabc123", 49983}, nil},
		{"host with port", "3000-xyz.example.com:443", nil, Target{"xyz", 3000}, nil},
		{"only the id header", "localhost", map[string]string{HeaderSandboxID: "abc"}, Target{}, ErrBadTarget},
		{"only the port header", "localhost", map[string]string{HeaderSandboxPort: "1"}, Target{}, ErrBadTarget},
		{"bad id", "localhost", map[string]string{HeaderSandboxID: "ABC", HeaderSandboxPort: "1"}, Target{}, ErrBadTarget},
		{"id with a dash", "localhost", map[string]string{HeaderSandboxID: "a-b", HeaderSandboxPort: "1"}, Target{}, ErrBadTarget},
		{"bad port", "localhost", map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "http"}, Target{}, ErrBadTarget},
		{"port too big", "localhost", map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "65536"}, Target{}, ErrBadTarget},
		{"port zero", "localhost", map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "0"}, Target{}, ErrBadTarget},
		{"host with a bad id", "3000-ABC.example.com", nil, Target{}, ErrBadTarget},
		{"plain host", "api.example.com", nil, Target{}, ErrNoTarget},
		{"ip", "127.0.0.1:49983", nil, Target{}, ErrNoTarget},
		{"label without a port", "foo-bar.example.com", nil, Target{}, ErrNoTarget},
		{"empty host", "", nil, Target{}, ErrNoTarget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			got, err := Parse(r)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || got != tc.want {
				t.Fatalf("Parse = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
	if !(Target{Port: 49983}).IsEnvd() || (Target{Port: 3000}).IsEnvd() {
		t.Fatal("IsEnvd is wrong")
	}
}

func TestBlockedEnvdPath(t *testing.T) {
	for path, want := range map[string]bool{
		"/init": true, "/init/": true, "/freeze": true, "/unfreeze": true, "/collapse": true, "/fsfreeze": true,
		"/fsthaw": true, "/upgrade": true, "/files": false, "/health": false, "/process.Process/Start": false, "/initx": false,
	} {
		if got := BlockedEnvdPath(path); got != want {
			t.Errorf("BlockedEnvdPath(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestWriteSandboxNotFound(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteSandboxNotFound(rec, httptest.NewRequest(http.MethodGet, "/", nil), `ab"c`)
	var body struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}
	if rec.Code != http.StatusBadGateway || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.SandboxID != `ab"c` || body.Code != 502 || body.Message != "The sandbox was not found" {
		t.Fatalf("JSON answer = %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Accept", "text/html,application/xhtml+xml")
	WriteSandboxNotFound(rec, r, "<script>")
	if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Header().Get("Content-Type"), "text/html") || strings.Contains(rec.Body.String(), "<script>") {
		t.Fatalf("HTML answer = %d %q", rec.Code, rec.Body)
	}
}

// Parse never panics; what it accepts is a well-formed target.
func FuzzParse(f *testing.F) {
	f.Add("49983-abc.example.com", "", "")
	f.Add("localhost", "abc", "49983")
	f.Add("", "", "1")
	f.Add("65535-z.a:1", "", "")
	f.Fuzz(func(t *testing.T, host, id, port string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Host = host
		if id != "" {
			r.Header[HeaderSandboxID] = []string{id}
		}
		if port != "" {
			r.Header[HeaderSandboxPort] = []string{port}
		}
		got, err := Parse(r)
		if err != nil {
			return
		}
		if !validID(got.SandboxID) || got.Port == 0 {
			t.Fatalf("Parse accepted %+v from host %q id %q port %q", got, host, id, port)
		}
	})
}

// The headers are read strictly, for both edges: present means present with
// one value (repeats must agree), and empty is missing, as e2b's edge says.
func TestParseHeadersStrictly(t *testing.T) {
	const id = "abc123"
	for _, tc := range []struct {
		name    string
		headers http.Header
		want    error
	}{
		{"both, once", http.Header{HeaderSandboxID: {id}, HeaderSandboxPort: {"8080"}}, nil},
		{"repeated alike", http.Header{HeaderSandboxID: {id, id}, HeaderSandboxPort: {"8080", "8080"}}, nil},
		{"id present but empty", http.Header{HeaderSandboxID: {""}, HeaderSandboxPort: {"8080"}}, ErrBadTarget},
		{"port present but empty", http.Header{HeaderSandboxID: {id}, HeaderSandboxPort: {""}}, ErrBadTarget},
		{"both empty", http.Header{HeaderSandboxID: {""}, HeaderSandboxPort: {""}}, ErrBadTarget},
		{"two ids", http.Header{HeaderSandboxID: {id, "other1"}, HeaderSandboxPort: {"8080"}}, ErrBadTarget},
		{"two ports", http.Header{HeaderSandboxID: {id}, HeaderSandboxPort: {"8080", "9090"}}, ErrBadTarget},
	} {
		r := httptest.NewRequest(http.MethodGet, "http://8080-"+id+".example.com/", nil)
		r.Header = tc.headers
		got, err := Parse(r)
		if !errors.Is(err, tc.want) || (tc.want == nil && got != (Target{SandboxID: id, Port: 8080})) {
			t.Errorf("%s: %+v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
