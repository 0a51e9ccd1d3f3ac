package route

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/wire"
)

const (
	id    = "k3x9q2m7v1p8z0c4t7fa"
	token = "0123456789abcdef0123456789abcdef"
	// other is a sandbox whose token the proxy has never seen.
	other = "a1b2c3d4e5f6g7h8i9j0"
)

func TestResolve(t *testing.T) {
	tokens := NewTokens(8)
	tokens.Learn(token, id)
	for _, tc := range []struct {
		name    string
		host    string
		headers map[string][]string
		want    Target
		wantErr error
	}{
		{name: "headers", host: "127.0.0.1:3002",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"49983"}},
			want:    Target{routing.Target{SandboxID: id, Port: 49983}, ByHeader}},
		{name: "headers win over the host", host: "8080-" + id[:19] + "b.example.com",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"3000"}},
			want:    Target{routing.Target{SandboxID: id, Port: 3000}, ByHeader}},
		{name: "headers win over a token", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {"other"}, "E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {token}},
			want:    Target{routing.Target{SandboxID: "other", Port: 49983}, ByHeader}},
		{name: "the same header twice, same value", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id, id}, "E2b-Sandbox-Port": {"49983"}},
			want:    Target{routing.Target{SandboxID: id, Port: 49983}, ByHeader}},
		{name: "host", host: "49983-" + id + ".sandbox.example.com",
			want: Target{routing.Target{SandboxID: id, Port: 49983}, ByHost}},
		{name: "host with port", host: "8080-" + id + ".example.com:443",
			want: Target{routing.Target{SandboxID: id, Port: 8080}, ByHost}},
		{name: "host wins over a token", host: "8080-" + id + ".example.com",
			headers: map[string][]string{"X-Access-Token": {"unknown"}},
			want:    Target{routing.Target{SandboxID: id, Port: 8080}, ByHost}},
		{name: "token", host: "127.0.0.1:3002",
			headers: map[string][]string{"X-Access-Token": {token}},
			want:    Target{routing.Target{SandboxID: id, Port: routing.EnvdPort}, ByToken}},
		{name: "a sandboxd token carries its sandbox, never seen before", host: "127.0.0.1:3002",
			headers: map[string][]string{"X-Access-Token": {other + "." + strings.Repeat("ab", 32)}},
			want:    Target{routing.Target{SandboxID: other, Port: routing.EnvdPort}, ByToken}},
		{name: "an unknown token of another shape", host: "127.0.0.1:3002",
			headers: map[string][]string{"X-Access-Token": {strings.Repeat("ab", 32)}}, wantErr: ErrNoTarget},

		{name: "id without port", host: "proxy", headers: map[string][]string{"E2b-Sandbox-Id": {id}}, wantErr: ErrBadTarget},
		{name: "port without id", host: "proxy", headers: map[string][]string{"E2b-Sandbox-Port": {"49983"}}, wantErr: ErrBadTarget},
		{name: "empty id header", host: "49983-" + id + ".example.com",
			headers: map[string][]string{"E2b-Sandbox-Id": {""}, "E2b-Sandbox-Port": {"49983"}}, wantErr: ErrBadTarget},
		{name: "both headers empty", host: "49983-" + id + ".example.com",
			headers: map[string][]string{"E2b-Sandbox-Id": {""}, "E2b-Sandbox-Port": {""}}, wantErr: ErrBadTarget},
		{name: "two different ids", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id, "other"}, "E2b-Sandbox-Port": {"49983"}}, wantErr: ErrBadTarget},
		{name: "two different ports", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"49983", "80"}}, wantErr: ErrBadTarget},
		{name: "port not a number", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"envd"}}, wantErr: ErrBadTarget},
		{name: "port 0", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"0"}}, wantErr: ErrBadTarget},
		{name: "port too big", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"65536"}}, wantErr: ErrBadTarget},
		{name: "negative port", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"-1"}}, wantErr: ErrBadTarget},
		{name: "upper-case id", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {strings.ToUpper(id)}, "E2b-Sandbox-Port": {"49983"}}, wantErr: ErrBadTarget},
		{name: "id with a dash", host: "proxy",
			headers: map[string][]string{"E2b-Sandbox-Id": {"abc-def"}, "E2b-Sandbox-Port": {"49983"}}, wantErr: ErrBadTarget},
		{name: "host with a bad id", host: "49983-Bad_ID.example.com", wantErr: ErrBadTarget},
		{name: "host with a bad port", host: "99999-" + id + ".example.com", wantErr: ErrBadTarget},

		{name: "nothing", host: "127.0.0.1:3002", wantErr: ErrNoTarget},
		{name: "plain host name", host: "sandbox.example.com", wantErr: ErrNoTarget},
		{name: "unknown token", host: "127.0.0.1:3002", headers: map[string][]string{"X-Access-Token": {"nope"}}, wantErr: ErrNoTarget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "http://x/files?path=%2Fa", nil)
			r.Host = tc.host
			for k, vs := range tc.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got, err := Resolve(r, tokens)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Resolve = %+v, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Resolve = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestResolveWithoutTokenRouting(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:3002/files", nil)
	r.Header.Set(wire.AccessTokenHeader, token)
	if got, err := Resolve(r, nil); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("Resolve with token routing off = %+v, %v; want ErrNoTarget", got, err)
	}
	// A token with its sandbox's ID needs no learned tokens.
	r.Header.Set(wire.AccessTokenHeader, other+"."+strings.Repeat("0", 64))
	if got, err := Resolve(r, nil); err != nil || got.SandboxID != other {
		t.Fatalf("Resolve of a sandboxd token with token routing off = %+v, %v; want %s", got, err, other)
	}
}

func TestTokensBoundForgetsTheLeastRecentlyUsed(t *testing.T) {
	tk := NewTokens(2)
	tk.Learn("a", "sa")
	tk.Learn("b", "sb")
	if got, ok := tk.Lookup("a"); !ok || got != "sa" { // a is now the most recent
		t.Fatalf("Lookup(a) = %q, %v", got, ok)
	}
	tk.Learn("c", "sc") // evicts b
	if _, ok := tk.Lookup("b"); ok {
		t.Error("b should have been evicted")
	}
	for tok, want := range map[string]string{"a": "sa", "c": "sc"} {
		if got, ok := tk.Lookup(tok); !ok || got != want {
			t.Errorf("Lookup(%s) = %q, %v; want %q", tok, got, ok, want)
		}
	}
	if tk.Len() != 2 {
		t.Errorf("Len = %d, want 2", tk.Len())
	}
	tk.Learn("a", "sa2") // a token seen on another sandbox follows it
	if got, _ := tk.Lookup("a"); got != "sa2" {
		t.Errorf("Lookup(a) after relearning = %q", got)
	}
	tk.Forget("a", "sa") // not its sandbox any more: kept
	if _, ok := tk.Lookup("a"); !ok {
		t.Error("Forget with another sandbox dropped the token")
	}
	tk.Forget("a", "sa2")
	if _, ok := tk.Lookup("a"); ok || tk.Len() != 1 {
		t.Errorf("after Forget: Lookup(a) ok=%v, Len=%d", ok, tk.Len())
	}
	tk.Learn("", "sx")
	if tk.Len() != 1 {
		t.Error("an empty token was learned")
	}
}

func TestTokensOffIsNil(t *testing.T) {
	tk := NewTokens(0)
	if tk != nil {
		t.Fatal("NewTokens(0) should turn token routing off")
	}
	tk.Learn(token, id) // must not panic
	if _, ok := tk.Lookup(token); ok || tk.Len() != 0 {
		t.Fatal("a nil Tokens knows a token")
	}
}
