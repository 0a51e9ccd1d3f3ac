package e2bapi

import (
	"net/http"
	"testing"
)

// autoResume and network.allowPublicTraffic=false reach the backend; the
// traffic token comes back from create, connect and resume (null for a
// public sandbox); GET says lifecycle.autoResume and network.
func TestCreatePrivateAutoResume(t *testing.T) {
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		t.Run(path, func(t *testing.T) {
			f, h := newTestServer(t)
			body := `{"templateID":"base","secure":true,"autoResume":{"enabled":true},"network":{"allowPublicTraffic":false}}`
			sb := wantSandbox(t, do(t, h, http.MethodPost, path, body, keyA), http.StatusCreated)
			p := f.lastCreate
			if !p.AutoResume || p.AllowPublicTraffic == nil || *p.AllowPublicTraffic {
				t.Fatalf("params = %+v", p)
			}
			if sb.TrafficAccessToken == nil || *sb.TrafficAccessToken != "traffic-"+sb.SandboxID {
				t.Fatalf("trafficAccessToken = %v", sb.TrafficAccessToken)
			}

			rec := do(t, h, http.MethodGet, "/sandboxes/"+sb.SandboxID, "", keyA)
			wantStatus(t, rec, http.StatusOK)
			checkKeys(t, "SandboxDetail", keysOf(t, rec.Body.Bytes()), detailRequired, detailOptional)
			var d sandboxDetailJSON
			strictDecode(t, rec.Body.Bytes(), &d)
			if !d.Lifecycle.AutoResume || d.Network == nil || d.Network.AllowPublicTraffic {
				t.Fatalf("detail lifecycle %+v network %+v", d.Lifecycle, d.Network)
			}
			if _, ok := keysOf(t, rec.Body.Bytes())["trafficAccessToken"]; ok {
				t.Fatal("GET /sandboxes/{id} returns the traffic token")
			}

			c := wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", `{}`, keyA), http.StatusOK)
			if c.TrafficAccessToken == nil || *c.TrafficAccessToken != *sb.TrafficAccessToken {
				t.Fatalf("connect trafficAccessToken = %v", c.TrafficAccessToken)
			}
			wantStatus(t, do(t, h, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", `{}`, keyA), http.StatusNoContent)
			r := wantSandbox(t, do(t, h, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/resume", `{}`, keyA), http.StatusCreated)
			if r.TrafficAccessToken == nil || *r.TrafficAccessToken != *sb.TrafficAccessToken {
				t.Fatalf("resume trafficAccessToken = %v", r.TrafficAccessToken)
			}
		})
	}
}

func TestCreatePublicTraffic(t *testing.T) {
	for _, body := range []string{
		`{"templateID":"base"}`,
		`{"templateID":"base","network":{"allowPublicTraffic":true},"autoResume":{"enabled":false}}`,
		`{"templateID":"base","network":{},"autoResume":{}}`,
	} {
		f, h := newTestServer(t)
		sb := wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", body, keyA), http.StatusCreated)
		if p := f.lastCreate; p.AutoResume || (p.AllowPublicTraffic != nil && !*p.AllowPublicTraffic) || sb.TrafficAccessToken != nil {
			t.Fatalf("%s: params %+v, trafficAccessToken %v", body, p, sb.TrafficAccessToken)
		}
		rec := do(t, h, http.MethodGet, "/sandboxes/"+sb.SandboxID, "", keyA)
		wantStatus(t, rec, http.StatusOK)
		var d sandboxDetailJSON
		strictDecode(t, rec.Body.Bytes(), &d)
		if d.Lifecycle.AutoResume || d.Network == nil || !d.Network.AllowPublicTraffic {
			t.Fatalf("%s: detail lifecycle %+v network %+v", body, d.Lifecycle, d.Network)
		}
	}
	// A backend that does not know the network leaves it out.
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	m := keysOf(t, do(t, h, http.MethodGet, "/sandboxes/"+id, "", keyA).Body.Bytes())
	if _, ok := m["network"]; ok {
		t.Fatalf("network without the backend knowing: %v", m["network"])
	}
}
