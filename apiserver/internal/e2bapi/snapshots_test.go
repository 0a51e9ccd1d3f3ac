package e2bapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
)

type wireSnapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func decodeSnapshot(t *testing.T, rec *httptest.ResponseRecorder) wireSnapshot {
	t.Helper()
	var s wireSnapshot
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	return s
}

func decodeSnapshots(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	var out []wireSnapshot
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	ids := []string{}
	for _, s := range out {
		ids = append(ids, s.SnapshotID)
	}
	return ids
}

// snapshotID and names are e2b's: the team's namespace and the tag.
func TestCreateSnapshot(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	paused := f.add(teamA, StatePaused, t0, nil)

	rec := do(t, h, "POST", "/sandboxes/"+id+"/snapshots", "{}", keyA)
	wantStatus(t, rec, http.StatusCreated)
	s := decodeSnapshot(t, rec)
	if len(s.SnapshotID) != 20+len(":default") || s.SnapshotID[20:] != ":default" || s.Names == nil || len(s.Names) != 0 {
		t.Errorf("unnamed snapshot = %+v, want <ID>:default and no names", s)
	}
	for body, want := range map[string]string{
		`{"name":"snap-x"}`:        "team-a/snap-x:default",
		`{"name":"team-a/snap-y"}`: "team-a/snap-y:default",
		`{"name":"snap-z:v2"}`:     "team-a/snap-z:v2",
	} {
		rec := do(t, h, "POST", "/sandboxes/"+id+"/snapshots", body, keyA)
		wantStatus(t, rec, http.StatusCreated)
		if s := decodeSnapshot(t, rec); s.SnapshotID != want || len(s.Names) != 1 || s.SnapshotID[:len(s.Names[0])] != s.Names[0] {
			t.Errorf("%s: %+v, want %s", body, s, want)
		}
	}
	wantError(t, do(t, h, "POST", "/sandboxes/"+id+"/snapshots", `{"name":"team-b/x"}`, keyA), http.StatusBadRequest, "namespace")
	// A name shaped like an ID would be taken for one by every lookup: it
	// could never be used or deleted.
	n := f.count("Snapshot")
	for _, name := range []string{"abcdefghij0123456789", "team-a/abcdefghij0123456789", "abcdefghij0123456789:v1", id} {
		wantError(t, do(t, h, "POST", "/sandboxes/"+id+"/snapshots", `{"name":"`+name+`"}`, keyA), http.StatusBadRequest, "name", "snapshot ID")
	}
	if f.count("Snapshot") != n {
		t.Error("a snapshot named like an ID reached the backend")
	}
	// Near misses are names.
	for _, name := range []string{"abcdefghij012345678", "abcdefghij01234567890", "abcdefghij-123456789"} {
		wantStatus(t, do(t, h, "POST", "/sandboxes/"+id+"/snapshots", `{"name":"`+name+`"}`, keyA), http.StatusCreated)
	}
	wantError(t, do(t, h, "POST", "/sandboxes/"+paused+"/snapshots", `{}`, keyA), http.StatusNotFound, "not found")
	wantError(t, do(t, h, "POST", "/sandboxes/"+id+"/snapshots", `{}`, keyB), http.StatusNotFound, "not found")
	wantError(t, do(t, h, "POST", "/sandboxes/nope/snapshots", `{}`, keyA), http.StatusNotFound)
}

func TestListSnapshots(t *testing.T) {
	f, h := newTestServer(t)
	a := f.add(teamA, StateRunning, t0, nil)
	b := f.add(teamA, StateRunning, t0, nil)
	var ids []string
	for _, req := range []struct{ sb, body string }{{a, `{}`}, {a, `{"name":"one"}`}, {b, `{"name":"two:v1"}`}} {
		rec := do(t, h, "POST", "/sandboxes/"+req.sb+"/snapshots", req.body, keyA)
		wantStatus(t, rec, http.StatusCreated)
		ids = append(ids, decodeSnapshot(t, rec).SnapshotID)
	}
	newestFirst := []string{ids[2], ids[1], ids[0]}

	rec := do(t, h, "GET", "/snapshots", "", keyA)
	wantStatus(t, rec, http.StatusOK)
	if got := decodeSnapshots(t, rec); !slices.Equal(got, newestFirst) || rec.Header().Get("X-Next-Token") != "" {
		t.Errorf("list = %v (next %q), want %v", got, rec.Header().Get("X-Next-Token"), newestFirst)
	}
	// Pages of one, following X-Next-Token.
	var paged []string
	target := "/snapshots?limit=1"
	for range 4 {
		rec := do(t, h, "GET", target, "", keyA)
		wantStatus(t, rec, http.StatusOK)
		paged = append(paged, decodeSnapshots(t, rec)...)
		next := rec.Header().Get("X-Next-Token")
		if next == "" {
			break
		}
		target = "/snapshots?limit=1&nextToken=" + next
	}
	if !slices.Equal(paged, newestFirst) {
		t.Errorf("paged = %v, want %v", paged, newestFirst)
	}
	for query, want := range map[string][]string{
		"?sandboxID=" + b:       {ids[2]},
		"?name=one":             {ids[1]},
		"?name=team-a/one":      {ids[1]},
		"?name=two":             {ids[2]},
		"?name=two:v1":          {ids[2]},
		"?name=two:v2":          {},
		"?name=one-not-a-thing": {},
	} {
		rec := do(t, h, "GET", "/snapshots"+query, "", keyA)
		wantStatus(t, rec, http.StatusOK)
		if got := decodeSnapshots(t, rec); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", query, got, want)
		}
	}
	if got := decodeSnapshots(t, do(t, h, "GET", "/snapshots", "", keyB)); len(got) != 0 {
		t.Errorf("team-b lists %v", got)
	}
	wantError(t, do(t, h, "GET", "/snapshots?nextToken=garbage!", "", keyA), http.StatusBadRequest, "Invalid next token")
	wantError(t, do(t, h, "GET", "/snapshots?limit=0", "", keyA), http.StatusBadRequest, "limit")
	wantError(t, do(t, h, "GET", "/snapshots?name=team-b/one", "", keyA), http.StatusBadRequest, "namespace")
	wantError(t, do(t, h, "GET", "/snapshots?sandboxID=bad", "", keyA), http.StatusBadRequest, "Invalid sandbox ID")
}

// The SDK's deleteSnapshot: 204 deleted, 404 (false) when it is not there.
func TestDeleteSnapshot(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	unnamed := decodeSnapshot(t, do(t, h, "POST", "/sandboxes/"+id+"/snapshots", `{}`, keyA)).SnapshotID
	named := decodeSnapshot(t, do(t, h, "POST", "/sandboxes/"+id+"/snapshots", `{"name":"keep"}`, keyA)).SnapshotID

	wantError(t, do(t, h, "DELETE", "/templates/"+unnamed, "", keyB), http.StatusNotFound)
	wantStatus(t, do(t, h, "DELETE", "/templates/"+unnamed, "", keyA), http.StatusNoContent)
	wantError(t, do(t, h, "DELETE", "/templates/"+unnamed, "", keyA), http.StatusNotFound, "not found")
	// The SDK escapes the path parameter: "team-a%2Fkeep%3Adefault".
	wantStatus(t, do(t, h, "DELETE", "/templates/"+url.PathEscape(named), "", keyA), http.StatusNoContent)
	wantError(t, do(t, h, "DELETE", "/templates/base", "", keyA), http.StatusNotImplemented, "only snapshots")
	wantError(t, do(t, h, "DELETE", "/templates/nothing-here", "", keyA), http.StatusNotFound)
	if n := len(f.snapshots); n != 0 {
		t.Errorf("%d snapshots left", n)
	}
}

func TestFork(t *testing.T) {
	f, h := newTestServer(t)
	id := f.add(teamA, StateRunning, t0, nil)
	rec := do(t, h, "POST", "/sandboxes/"+id+"/fork", `{"count":3,"timeout":60}`, keyA)
	wantStatus(t, rec, http.StatusCreated)
	var out []struct {
		Sandbox *struct {
			SandboxID       string `json:"sandboxID"`
			EnvdAccessToken string `json:"envdAccessToken"`
		} `json:"sandbox"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || out[0].Sandbox == nil || out[0].Sandbox.EnvdAccessToken == "" || out[0].Error != nil ||
		out[1].Sandbox != nil || out[1].Error == nil || out[1].Error.Code != http.StatusServiceUnavailable || out[2].Sandbox == nil {
		t.Fatalf("fork results: %s", rec.Body)
	}
	if f.lastFork != 3 {
		t.Errorf("count %d reached the backend", f.lastFork)
	}
	wantStatus(t, do(t, h, "POST", "/sandboxes/"+id+"/fork", ``, keyA), http.StatusCreated)
	if f.lastFork != 1 {
		t.Errorf("no body: count %d, want e2b's default 1", f.lastFork)
	}
	wantError(t, do(t, h, "POST", "/sandboxes/"+id+"/fork", `{"count":0}`, keyA), http.StatusBadRequest, "count")
	wantError(t, do(t, h, "POST", "/sandboxes/"+id+"/fork", `{"count":101}`, keyA), http.StatusBadRequest, "count")
	wantError(t, do(t, h, "POST", "/sandboxes/"+id+"/fork", `{}`, keyB), http.StatusNotFound)
}

func TestParseSnapshotRef(t *testing.T) {
	id := "abcdefghij0123456789"
	for in, want := range map[string]*SnapshotRef{
		id:                    {ID: id},
		id + ":default":       {ID: id},
		"team-a/" + id:        {ID: id},
		"snap":                {Name: "snap", Tag: "default"},
		"snap:v1":             {Name: "snap", Tag: "v1"},
		"team-a/snap:v1":      {Name: "snap", Tag: "v1"},
		"team-b/snap":         nil,
		id + ":v1":            nil,
		"":                    nil,
		"a/b/c":               nil,
		"snap:v1:v2":          nil,
		"team-a/":             nil,
		"team-a/snap:default": {Name: "snap", Tag: "default"},
	} {
		got, ok := ParseSnapshotRef(teamA, in)
		if want == nil {
			if ok {
				t.Errorf("%q: %+v, want none", in, got)
			}
			continue
		}
		if !ok || got != *want {
			t.Errorf("%q: %+v %v, want %+v", in, got, ok, *want)
		}
	}
}
