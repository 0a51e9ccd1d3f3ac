package e2bapi

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/wire"
)

// checkAnswer fails unless rec is a well-formed answer: a JSON error in
// e2b's shape, an empty 204, or a JSON success.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	switch {
	case rec.Code >= 400:
		var e wire.Error
		dec := json.NewDecoder(strings.NewReader(rec.Body.String()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || e.Code != rec.Code || e.Message == "" ||
			rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("status %d with body %q (%v)", rec.Code, rec.Body.String(), err)
		}
	case rec.Code == http.StatusNoContent:
		if rec.Body.Len() != 0 {
			t.Fatalf("204 with body %q", rec.Body.String())
		}
	case rec.Code == http.StatusOK || rec.Code == http.StatusCreated:
		if !json.Valid(rec.Body.Bytes()) || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("status %d with body %q", rec.Code, rec.Body.String())
		}
	default:
		t.Fatalf("unexpected status %d: %q", rec.Code, rec.Body.String())
	}
}

func FuzzCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"base"}`,
		`{"templateID":"base-alias","timeout":300,"secure":true,"allow_internet_access":true,"metadata":{"a":"b"},"envVars":{"A":"1"}}`,
		`{"templateID":"base","network":{"denyOut":["ALL_TRAFFIC"]},"autoPause":true,"autoResume":{"enabled":false}}`,
		`{"templateID":"base","timeout":-1}`, `{"templateID":"base","timeout":1e400}`, `{"templateID":7}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/d"}]}`, `{"templateID":"base","mcp":{}}`,
		`[]`, `null`, ``, `{`, `{"templateID":"base"} x`, "\xff", `{"metadata":{"` + strings.Repeat("k", 70) + `":"v"}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			fb, h := newTestServer(t)
			rec := do(t, h, http.MethodPost, path, body, keyA)
			checkAnswer(t, rec)
			switch rec.Code {
			case http.StatusCreated:
				if fb.count("Create") != 1 {
					t.Fatal("201 without a create")
				}
				var sb wireSandbox
				if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil || !validID(sb.SandboxID) {
					t.Fatalf("201 body %s", rec.Body.String())
				}
			case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusNotImplemented: // 404: an unknown template
				if fb.count("Create") != 0 {
					t.Fatalf("%d after a create reached the backend", rec.Code)
				}
			default:
				t.Fatalf("status %d for %q", rec.Code, body)
			}
		}
	})
}

func FuzzListQuery(f *testing.F) {
	f.Add("user%3Da%252520b", "running,paused", "", "limit=2&order=asc")
	f.Add("a=b", "paused", "MTc3MjM2NjQwMC4wLmFiYw", "")
	f.Add("%25YY", "running,", "!!", "startedAfter=2026-03-01T12:00:00Z")
	f.Add("", "", "", "template=base-alias")
	f.Add("k%3Dx%25253Dy", "RUNNING", "YQ", "limit=101")
	f.Fuzz(func(t *testing.T, metadata, state, nextToken, extra string) {
		fb, h := newTestServer(t)
		for i := range 5 {
			fb.add(teamA, []State{StateRunning, StatePaused}[i%2], t0, map[string]string{"user": "a b"})
		}
		q := url.Values{}
		if metadata != "" {
			q.Set("metadata", metadata)
		}
		if state != "" {
			q.Set("state", state)
		}
		if nextToken != "" {
			q.Set("nextToken", nextToken)
		}
		raw := q.Encode()
		if extra != "" {
			raw += "&" + extra
		}
		for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
			// Set the raw query directly: the server must cope with any bytes
			// a client puts there, even ones NewRequest would refuse.
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.URL.RawQuery = raw
			req.RequestURI = path + "?" + raw
			req.Header.Set("X-API-Key", keyA)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			checkAnswer(t, rec)
			if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
				t.Fatalf("status %d for %q", rec.Code, raw)
			}
			if rec.Code == http.StatusOK {
				var l []wireListed
				if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
					t.Fatalf("list body %s", rec.Body.String())
				}
			}
		}
		// Whatever the SDK encodes, the server decodes back.
		if metadata != "" {
			md := map[string]string{metadata: state}
			pq, err := url.ParseQuery(sdkMetadataQuery(md))
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseMetadataFilter(pq.Get("metadata"))
			if err != nil || !maps.Equal(got, md) {
				t.Fatalf("SDK round trip of %q = %v, %v", md, got, err)
			}
		}
	})
}

func FuzzPathID(f *testing.F) {
	for _, s := range []string{"abcdefghij0123456789", "short", "ABCDEFGHIJKLMNOPQRST", "abcdefghij0123456789-6532622b", "../health", "a/b", "%2e%2e", "", " ", "\x00"} {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, id string, route uint8) {
		fb, h := newTestServer(t)
		fb.addWithID("abcdefghij0123456789", teamA, StateRunning, t0, nil)
		fb.addWithID("zyxwvutsrq9876543210", teamB, StateRunning, t0, nil)
		rt := sandboxRoutes[int(route)%len(sandboxRoutes)]
		for _, seg := range []string{url.PathEscape(id), id} {
			target := strings.Replace(rt.path, "%s", seg, 1)
			u, err := url.Parse(target)
			if err != nil || u.Host != "" || u.Scheme != "" || !strings.HasPrefix(target, "/") {
				continue
			}
			req := httptest.NewRequest(rt.method, "/", strings.NewReader(rt.body))
			req.URL = u
			req.RequestURI = target
			req.Header.Set("X-API-Key", keyA)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			checkAnswer(t, rec)
			if strings.Contains(target, "zyxwvutsrq9876543210") && rec.Code < 300 {
				t.Fatalf("%s %s reached another team's sandbox: %d", rt.method, target, rec.Code)
			}
		}
	})
}
