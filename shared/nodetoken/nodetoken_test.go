package nodetoken_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/shared/nodetoken"
)

const key = "0123456789abcdef0123456789abcdef"

// The known answers are openssl's: printf host-a | openssl dgst -sha256 -hmac $key.
func TestDerive(t *testing.T) {
	for node, want := range map[string]string{
		"host-a": "e9fcac7952749dc54be33b7022727d2eb732084334f1ffc7966771a9eab3aae6",
		"host-b": "d12db135ea5023d41d817348f2b9902df460d0b7baf100240150eb8e3a5247d6",
	} {
		if got := nodetoken.Derive([]byte(key), node); got != want {
			t.Errorf("Derive(%s) = %s, want %s", node, got, want)
		}
	}
	if nodetoken.Derive([]byte(key), "host-a") == nodetoken.Derive([]byte(key+"x"), "host-a") {
		t.Error("two keys derive one token")
	}
}

func TestTokensFor(t *testing.T) {
	shared := nodetoken.Shared("fleet-wide-token-0123")
	derived := nodetoken.Derived([]byte(key))
	for _, tc := range []struct {
		name   string
		tokens *nodetoken.Tokens
		node   string
		want   string
	}{
		{"shared, a node", shared, "host-a", "fleet-wide-token-0123"},
		{"shared, another node", shared, "host-b", "fleet-wide-token-0123"},
		{"shared, unnamed", shared, "", "fleet-wide-token-0123"},
		{"derived, a node", derived, "host-a", nodetoken.Derive([]byte(key), "host-a")},
		{"derived, another node", derived, "host-b", nodetoken.Derive([]byte(key), "host-b")},
		{"derived, unnamed", derived, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 { // the second from the cache
				if got := tc.tokens.For(tc.node); got != tc.want {
					t.Errorf("For(%q) = %q, want %q", tc.node, got, tc.want)
				}
			}
		})
	}
	if shared.PerNode() || !derived.PerNode() {
		t.Error("PerNode is wrong")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if derived.For("host-c") != nodetoken.Derive([]byte(key), "host-c") {
				t.Error("concurrent For disagrees")
			}
		})
	}
	wg.Wait()
}

func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOptions(t *testing.T) {
	tokenFile, keyFile := write(t, " fleet-wide-token-0123\n"), write(t, key+"\n")
	for _, tc := range []struct {
		name    string
		args    []string
		perNode bool
		wantErr string // substring; empty: valid and loads
		want    func(*nodetoken.Tokens) bool
	}{
		{"token, static", []string{"--sandboxd-token-file", tokenFile}, false, "",
			func(tk *nodetoken.Tokens) bool { return tk.For("") == "fleet-wide-token-0123" }},
		{"token, kube", []string{"--sandboxd-token-file", tokenFile}, true, "",
			func(tk *nodetoken.Tokens) bool { return tk.For("host-a") == "fleet-wide-token-0123" }},
		{"key, kube", []string{"--node-token-key-file", keyFile}, true, "",
			func(tk *nodetoken.Tokens) bool { return tk.For("host-a") == nodetoken.Derive([]byte(key), "host-a") }},
		{"key, static", []string{"--node-token-key-file", keyFile}, false, "--node-token-key-file is only read with --inventory kube", nil},
		{"both", []string{"--sandboxd-token-file", tokenFile, "--node-token-key-file", keyFile}, true, "exclude each other", nil},
		{"neither, static", nil, false, "--sandboxd-token-file is required", nil},
		{"neither, kube", nil, true, "set --sandboxd-token-file (a token every host accepts) or --node-token-key-file", nil},
		{"short token", []string{"--sandboxd-token-file", write(t, "short\n")}, true, "--sandboxd-token-file /", nil},
		{"missing token file", []string{"--sandboxd-token-file", "/no/such/file"}, true, "read --sandboxd-token-file", nil},
		{"short key", []string{"--node-token-key-file", write(t, "0123456789abcdef\n")}, true, "--node-token-key-file /", nil},
		{"missing key file", []string{"--node-token-key-file", "/no/such/file"}, true, "read --node-token-key-file", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o nodetoken.Options
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate(tc.perNode)
			var tokens *nodetoken.Tokens
			if err == nil {
				tokens, err = o.Load()
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one with %q", err, tc.wantErr)
			case tc.want != nil && !tc.want(tokens):
				t.Fatalf("loaded the wrong tokens")
			}
		})
	}
}

func TestPullTicket(t *testing.T) {
	Derive, PullTicket, CheckPullTicket, ErrTicket := nodetoken.Derive, nodetoken.PullTicket, nodetoken.CheckPullTicket, nodetoken.ErrTicket
	now := time.Unix(1_800_000_000, 0)
	tok := Derive([]byte("0123456789abcdef0123456789abcdef"), "host-a")
	ticket := PullTicket(tok, "snapaaaaaaaaaaaatag1", now.Add(time.Minute))
	if err := CheckPullTicket(tok, "snapaaaaaaaaaaaatag1", ticket, now); err != nil {
		t.Fatalf("a fresh ticket: %v", err)
	}
	other := Derive([]byte("0123456789abcdef0123456789abcdef"), "host-b")
	for name, err := range map[string]error{
		"another snapshot": CheckPullTicket(tok, "snapbbbbbbbbbbbbtag1", ticket, now),
		"another host":     CheckPullTicket(other, "snapaaaaaaaaaaaatag1", ticket, now),
		"expired":          CheckPullTicket(tok, "snapaaaaaaaaaaaatag1", ticket, now.Add(2*time.Minute)),
		"a later expiry":   CheckPullTicket(tok, "snapaaaaaaaaaaaatag1", strings.Replace(ticket, "1800000060", "1900000060", 1), now),
		"malformed":        CheckPullTicket(tok, "snapaaaaaaaaaaaatag1", "nonsense", now),
		"no token":         CheckPullTicket("", "snapaaaaaaaaaaaatag1", ticket, now),
	} {
		if !errors.Is(err, ErrTicket) {
			t.Errorf("%s: %v, want ErrTicket", name, err)
		}
	}
}

// A volume token opens its volume of its team until it expires, and only
// with the key it was made with; a changed byte opens nothing.
func TestVolumeToken(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	key := nodetoken.Shared("token").VolumeKey()
	if len(key) != 32 {
		t.Fatalf("a volume key of %d bytes", len(key))
	}
	tok := nodetoken.VolumeToken(key, "team-a", "0f3c2f4e-1d2b-4c5a-9e8f-7a6b5c4d3e2f", now.Add(time.Hour))
	team, vol, err := nodetoken.CheckVolumeToken(key, tok, now)
	if err != nil || team != "team-a" || vol != "0f3c2f4e-1d2b-4c5a-9e8f-7a6b5c4d3e2f" {
		t.Fatalf("CheckVolumeToken = %q, %q, %v", team, vol, err)
	}
	if _, _, err := nodetoken.CheckVolumeToken(key, tok, now.Add(2*time.Hour)); !errors.Is(err, nodetoken.ErrVolumeToken) {
		t.Errorf("expired: %v", err)
	}
	if _, _, err := nodetoken.CheckVolumeToken(nodetoken.Shared("other").VolumeKey(), tok, now); !errors.Is(err, nodetoken.ErrVolumeToken) {
		t.Errorf("another key: %v", err)
	}
	for i := range tok {
		bad := []byte(tok)
		bad[i] ^= 1
		if _, _, err := nodetoken.CheckVolumeToken(key, string(bad), now); err == nil {
			t.Fatalf("byte %d changed still opens", i)
		}
	}
	for _, bad := range []string{"", "skv1.", "skv1.a.b.c", "x." + tok} {
		if _, _, err := nodetoken.CheckVolumeToken(key, bad, now); !errors.Is(err, nodetoken.ErrVolumeToken) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
