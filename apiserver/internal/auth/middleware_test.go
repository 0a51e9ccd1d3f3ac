package auth_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
)

const goodKey = "e2b_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// mapStore is a Store over a map; brokenKey makes it fail as a store that
// cannot reach its backend would.
type mapStore map[string]string

const brokenKey = "e2b_ffffffffffffffffffffffffffffffffffffffff"

func (m mapStore) Team(_ context.Context, key string) (string, error) {
	if key == brokenKey {
		return "", errors.New("cache not synced")
	}
	if team, ok := m[key]; ok {
		return team, nil
	}
	return "", auth.ErrUnknownKey
}

func TestMiddleware(t *testing.T) {
	store := mapStore{goodKey: "team-a"}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		team, ok := auth.TeamFrom(r.Context())
		if !ok {
			t.Error("next ran without a team")
		}
		if r.Header.Get(auth.HeaderAPIKey) != "" {
			t.Error("next sees the API key header")
		}
		if r.Header.Get("Lang") != "js" {
			t.Error("next lost the other headers")
		}
		w.Header().Set("X-Team", team)
		w.WriteHeader(http.StatusNoContent)
	})
	h := auth.Middleware(store, next)

	for _, tt := range []struct {
		name     string
		headers  [][2]string
		want     int
		wantTeam string
		wantMsg  string
	}{
		{"key", [][2]string{{"X-API-Key", goodKey}}, http.StatusNoContent, "team-a", ""},
		{"JS SDK spelling", [][2]string{{"X-API-KEY", goodKey}}, http.StatusNoContent, "team-a", ""},
		{"no key", nil, http.StatusUnauthorized, "", "missing API key"},
		{"empty key", [][2]string{{"X-API-Key", ""}}, http.StatusUnauthorized, "", "missing API key"},
		{"unknown key", [][2]string{{"X-API-Key", "e2b_" + strings.Repeat("1", 40)}}, http.StatusUnauthorized, "", "invalid API key"},
		{"malformed key", [][2]string{{"X-API-Key", "hello"}}, http.StatusUnauthorized, "", "invalid API key"},
		{"bearer token", [][2]string{{"Authorization", "Bearer sk_e2b_" + strings.Repeat("1", 40)}}, http.StatusUnauthorized, "", "access tokens are not accepted"},
		{"bearer with a key", [][2]string{{"Authorization", "Bearer " + goodKey}}, http.StatusUnauthorized, "", "X-API-Key"},
		{"two keys", [][2]string{{"X-API-Key", goodKey}, {"X-API-Key", goodKey}}, http.StatusUnauthorized, "", "more than one"},
		{"store failure", [][2]string{{"X-API-Key", brokenKey}}, http.StatusInternalServerError, "", "cannot check"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/sandboxes", strings.NewReader("{}"))
			req.Header.Set("Lang", "js")
			for _, h := range tt.headers {
				req.Header.Add(h[0], h[1])
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			res := rec.Result()
			defer res.Body.Close()
			if res.StatusCode != tt.want {
				t.Fatalf("status %d, want %d", res.StatusCode, tt.want)
			}
			if tt.want < 400 {
				if got := res.Header.Get("X-Team"); got != tt.wantTeam {
					t.Errorf("team %q, want %q", got, tt.wantTeam)
				}
				return
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var body struct {
				Code    *int    `json:"code"`
				Message *string `json:"message"`
			}
			dec := json.NewDecoder(res.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&body); err != nil {
				t.Fatalf("body: %v", err)
			}
			if body.Code == nil || *body.Code != tt.want {
				t.Errorf("code %v, want %d (the SDKs branch on it)", body.Code, tt.want)
			}
			if body.Message == nil || !strings.Contains(*body.Message, tt.wantMsg) {
				t.Errorf("message %v, want it to contain %q", body.Message, tt.wantMsg)
			}
			if strings.Contains(rec.Body.String(), "e2b_") {
				t.Errorf("error body echoes a key: %s", rec.Body.String())
			}
		})
	}
}

func TestTeamFrom(t *testing.T) {
	if team, ok := auth.TeamFrom(context.Background()); ok || team != "" {
		t.Errorf("TeamFrom(empty) = %q, %v", team, ok)
	}
	if team, ok := auth.TeamFrom(auth.WithTeam(context.Background(), "team-a")); !ok || team != "team-a" {
		t.Errorf("TeamFrom(WithTeam(team-a)) = %q, %v", team, ok)
	}
	if _, ok := auth.TeamFrom(auth.WithTeam(context.Background(), "")); ok {
		t.Error("TeamFrom(WithTeam(\"\")) reports a team")
	}
}
