package e2bapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/shared/nodetoken"
)

// The control routes in e2b's shapes and words: 201 with a token, a list
// with no token, a get with a fresh token and the size, 204 on delete;
// 400 for a bad name, a name taken (e2b answers 400, not 409), an ID that
// is no UUID; 404 for another team's volume or a missing one; 409 when a
// sandbox mounts it.
func TestVolumeRoutes(t *testing.T) {
	f, h := newTestServer(t)
	rec := do(t, h, http.MethodPost, "/volumes", `{"name":"my-vol_1"}`, keyA)
	wantStatus(t, rec, http.StatusCreated)
	var created volumeAndTokenJSON
	strictDecode(t, rec.Body.Bytes(), &created)
	if !volumeIDRE.MatchString(created.VolumeID) || created.Name != "my-vol_1" || created.Token == "" || created.SizeBytes != nil {
		t.Fatalf("created = %+v", created)
	}
	if team, vol, err := nodetoken.CheckVolumeToken(testVolumeKey, created.Token, time.Now()); err != nil || team != teamA || vol != created.VolumeID {
		t.Errorf("the token opens %q %q, %v", team, vol, err)
	}
	wantError(t, do(t, h, http.MethodPost, "/volumes", `{"name":"my-vol_1"}`, keyA), 400, "Volume with name 'my-vol_1' already exists")
	for _, body := range []string{`{}`, `{"name":""}`, `{"name":"a b"}`, `{"name":"a/b"}`, `{"name":"` + strings.Repeat("x", 251) + `"}`, `{"name":1}`} {
		wantError(t, do(t, h, http.MethodPost, "/volumes", body, keyA), 400, "name")
	}
	wantStatus(t, do(t, h, http.MethodPost, "/volumes", `{"name":"other"}`, keyB), http.StatusCreated)

	rec = do(t, h, http.MethodGet, "/volumes", "", keyA)
	wantStatus(t, rec, http.StatusOK)
	var list []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list) != 1 || list[0]["name"] != "my-vol_1" || list[0]["token"] != nil {
		t.Errorf("list = %s", rec.Body)
	}
	rec = do(t, h, http.MethodGet, "/volumes/"+created.VolumeID, "", keyA)
	wantStatus(t, rec, http.StatusOK)
	var got volumeAndTokenJSON
	strictDecode(t, rec.Body.Bytes(), &got)
	if got.VolumeID != created.VolumeID || got.Token == "" || got.SizeBytes == nil || *got.SizeBytes != 10<<30 || got.UsedBytes == nil || *got.UsedBytes != 4096 {
		t.Errorf("get = %+v", got)
	}
	wantError(t, do(t, h, http.MethodGet, "/volumes/"+created.VolumeID, "", keyB), 404, "Volume not found")
	wantError(t, do(t, h, http.MethodGet, "/volumes/not-a-uuid", "", keyA), 400, "Invalid volume ID")
	wantError(t, do(t, h, http.MethodDelete, "/volumes/"+created.VolumeID, "", keyB), 404, "Volume not found")

	f.mounted[created.VolumeID] = true
	wantError(t, do(t, h, http.MethodDelete, "/volumes/"+created.VolumeID, "", keyA), 409, "mounted")
	f.mounted[created.VolumeID] = false
	wantStatus(t, do(t, h, http.MethodDelete, "/volumes/"+created.VolumeID, "", keyA), http.StatusNoContent)
	wantError(t, do(t, h, http.MethodDelete, "/volumes/"+created.VolumeID, "", keyA), 404, "Volume not found")
	wantError(t, do(t, h, http.MethodGet, "/volumes", "", ""), 401, "API key")

	rec = do(t, h, http.MethodGet, "/volumes", "", keyA)
	if strings.TrimSpace(rec.Body.String()) != "[]" {
		t.Errorf("an empty list is %s, want []", rec.Body)
	}
}

// The content routes take the volume's token and nothing else: no token,
// another key's, an expired one, or one for another volume open nothing;
// the right one reaches the backend with its team.
func TestVolumeContentAuth(t *testing.T) {
	f, h := newTestServer(t)
	v, _ := f.CreateVolume(t.Context(), teamA, "v")
	w, _ := f.CreateVolume(t.Context(), teamA, "w")
	call := func(id, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/volumecontent/"+id+"/file?path=%2Fa.txt", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	good := nodetoken.VolumeToken(testVolumeKey, teamA, v.ID, time.Now().Add(time.Hour))
	rec := call(v.ID, "Bearer "+good)
	if rec.Code != 200 || rec.Body.String() != "GET "+teamA+" "+v.ID+" file /a.txt" {
		t.Fatalf("with the token: %d %s", rec.Code, rec.Body)
	}
	for name, tc := range map[string]struct {
		id, auth string
		status   int
	}{
		"no token":           {v.ID, "", 401},
		"an API key":         {v.ID, "Bearer " + keyA, 401},
		"another key's":      {v.ID, "Bearer " + nodetoken.VolumeToken([]byte("another key, another fleet....."), teamA, v.ID, time.Now().Add(time.Hour)), 401},
		"expired":            {v.ID, "Bearer " + nodetoken.VolumeToken(testVolumeKey, teamA, v.ID, time.Now().Add(-time.Second)), 401},
		"for another volume": {w.ID, "Bearer " + good, 403},
	} {
		rec := call(tc.id, tc.auth)
		var e struct{ Code, Message string }
		if rec.Code != tc.status || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Code != itoa(tc.status) || e.Message == "" {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body)
		}
	}
	if n := f.count("ServeVolumeContent"); n != 1 {
		t.Errorf("the backend served %d content calls, want 1", n)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// volumeMounts at create: e2b's checks, every fault in one 400; passed on
// by name and path.
func TestCreateWithVolumeMounts(t *testing.T) {
	f, h := newTestServer(t)
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"data","path":"/home/user/data"},{"name":"data","path":"/mnt/b"}]}`, keyA), http.StatusCreated)
	if got := f.lastCreate.VolumeMounts; !slices.Equal(got, []VolumeMount{{"data", "/home/user/data"}, {"data", "/mnt/b"}}) {
		t.Errorf("mounts = %v", got)
	}
	e := wantError(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"a","path":"rel"},{"name":"b","path":"/x/../y"},{"name":"c","path":"/m"},{"name":"d","path":"/m"},{"name":"e","path":""},{"name":"f","path":"/usr/bin"},{"name":"g","path":"/proc/x"}]}`, keyA), 400)
	want := "invalid mounts:\n\t- volume mount #0: path must be absolute\n\t- volume mount #1: path must not contain any '.' or '..' components\n\t- volume mount #3: path '/m' is already used\n\t- volume mount #4: path cannot be empty" +
		"\n\t- volume mount #5: path /usr/bin would hide what the sandbox runs on\n\t- volume mount #6: path /proc/x would hide what the sandbox runs on"
	if e.Message != want {
		t.Errorf("message = %q, want %q", e.Message, want)
	}
	wantSandbox(t, do(t, h, http.MethodPost, "/v2/sandboxes", `{"templateID":"base","volumeMounts":[]}`, keyA), http.StatusCreated)
	if f.lastCreate.VolumeMounts != nil {
		t.Errorf("an empty list gave %v", f.lastCreate.VolumeMounts)
	}
}
