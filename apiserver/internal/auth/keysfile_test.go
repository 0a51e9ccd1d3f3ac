package auth

import (
	"regexp"
	"strings"
	"testing"
)

const (
	keyA = "e2b_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	keyB = "e2b_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	keyC = "e2b_0123456789abcdef0123456789abcdef01234567"
)

func TestParseKeysFile(t *testing.T) {
	set, err := parseKeysFile([]byte("\uFEFF# keys\n\nteam-a " + keyA + "\r\n  team-b\t" + keyB + "   # bob's key\nteam-a " + keyA + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if set.n != 2 {
		t.Errorf("n = %d, want 2", set.n)
	}
	for _, tt := range []struct {
		key, team string
		ok        bool
	}{
		{keyA, "team-a", true},
		{keyB, "team-b", true},
		{keyC, "", false},
		{"", "", false},
		{strings.ToUpper(keyA), "", false},
		{keyA + " ", "", false},
	} {
		team, ok := set.team(tt.key)
		if team != tt.team || ok != tt.ok {
			t.Errorf("team(%q) = %q, %v; want %q, %v", tt.key, team, ok, tt.team, tt.ok)
		}
	}

	empty, err := parseKeysFile([]byte("# nobody yet\n"))
	if err != nil || empty.n != 0 {
		t.Fatalf("comment-only file: %v, %+v", err, empty)
	}
}

func TestParseKeysFileErrors(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		want       []string // each must appear in the error
	}{
		{"one field", "team-a\n", []string{"line 1: want two fields"}},
		{"three fields", "\nteam-a " + keyA + " extra\n", []string{"line 2: want two fields", "got 3"}},
		{"swapped", keyA + " team-a\n", []string{"line 1: the key comes second"}},
		{"upper-case team", "Team-A " + keyA + "\n", []string{"line 1: the team is not a valid namespace name"}},
		{"long team", strings.Repeat("a", 64) + " " + keyA + "\n", []string{"line 1: the team"}},
		{"underscore team", "team_a " + keyA + "\n", []string{"line 1: the team"}},
		{"short key", "team-a " + keyA[:40] + "\n", []string{"line 1: the key is not"}},
		{"upper-case key", "team-a " + strings.ToUpper(keyA) + "\n", []string{"line 1: the key is not"}},
		{"token", "team-a sk_e2b_" + keyA[4:] + "\n", []string{"line 1: the key is not"}},
		{
			"same key two teams",
			"team-a " + keyA + "\n# x\nteam-b " + keyB + "\nteam-c " + keyA + "\n",
			[]string{"lines 1 and 4: the same key is listed for two teams"},
		},
		{
			"every problem reported",
			"team-a\nBAD " + keyA + "\nteam-b " + keyB + "\n",
			[]string{"line 1:", "line 2:"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseKeysFile([]byte(tt.file))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			assertNoSecret(t, err.Error(), tt.file)
		})
	}
}

func TestParseKeysFileBoundsErrors(t *testing.T) {
	_, err := parseKeysFile([]byte(strings.Repeat("x\n", 100)))
	if err == nil {
		t.Fatal("no error")
	}
	if n := strings.Count(err.Error(), "want two fields"); n != maxParseErrors {
		t.Errorf("%d problems reported, want %d", n, maxParseErrors)
	}
	if !strings.Contains(err.Error(), "more problems follow") {
		t.Errorf("error %q does not say more problems follow", err)
	}
}

// keyish matches anything that could be (part of) a key in an error message.
var keyish = regexp.MustCompile(`(?i)e2b_[0-9a-f]{4}|[0-9a-f]{12}`)

func assertNoSecret(t *testing.T, msg, file string) {
	t.Helper()
	if keyish.MatchString(msg) {
		t.Errorf("error quotes key material: %q", msg)
	}
	for _, f := range strings.Fields(file) {
		if len(f) >= 8 && strings.Contains(msg, f) {
			t.Errorf("error quotes the file (%q): %q", f, msg)
		}
	}
}

// The parser reads a file operators write by hand: it must not panic, must
// never quote a key in an error, and must map every key it accepts back to a
// team.
func FuzzParseKeysFile(f *testing.F) {
	f.Add([]byte("team-a " + keyA + "\nteam-b " + keyB + "\n"))
	f.Add([]byte("# c\n\nteam-a " + keyA + " # c\r\n"))
	f.Add([]byte(keyA + " team-a\nteam-b " + keyA + "\n"))
	f.Add([]byte("\uFEFFa " + keyC))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := parseKeysFile(data)
		if err != nil {
			if keyish.MatchString(err.Error()) {
				// The messages are fixed text and line numbers; a match can
				// only be a quoted key.
				t.Fatalf("error quotes key material: %q", err)
			}
			return
		}
		for _, line := range strings.Split(strings.TrimPrefix(string(data), "\uFEFF"), "\n") {
			line, _, _ = strings.Cut(line, "#")
			if f := strings.Fields(line); len(f) == 2 {
				if team, ok := set.team(f[1]); !ok || team != f[0] {
					t.Fatalf("accepted line %q but team(key) = %q, %v", line, team, ok)
				}
			}
		}
	})
}

// Whatever a client sends as its key, a lookup answers only for the exact
// keys in the file.
func FuzzKeySetTeam(f *testing.F) {
	set, err := parseKeysFile([]byte("team-a " + keyA + "\nteam-b " + keyB + "\n"))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{keyA, keyB, keyC, "", "e2b_", keyA[:43], keyA + "a", strings.ToUpper(keyB)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		team, ok := set.team(key)
		switch key {
		case keyA:
			if team != "team-a" || !ok {
				t.Fatalf("team(keyA) = %q, %v", team, ok)
			}
		case keyB:
			if team != "team-b" || !ok {
				t.Fatalf("team(keyB) = %q, %v", team, ok)
			}
		default:
			if ok || team != "" {
				t.Fatalf("team(%q) = %q, %v; want no team", key, team, ok)
			}
		}
	})
}
