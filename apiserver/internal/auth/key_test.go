package auth_test

import (
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/apiserver/internal/auth"
)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		key, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if !auth.ValidKey(key) {
			t.Fatalf("NewKey() = %q, not a valid key", key)
		}
		if seen[key] {
			t.Fatalf("NewKey() repeated %q", key)
		}
		seen[key] = true
	}
}

func TestValidKey(t *testing.T) {
	hex40 := strings.Repeat("0123456789abcdef", 3)[:40]
	for _, tt := range []struct {
		key  string
		want bool
	}{
		{"e2b_" + hex40, true},
		{"e2b_" + strings.Repeat("f", 40), true},
		{"", false},
		{"e2b_", false},
		{"e2b_" + hex40[:39], false},
		{"e2b_" + hex40 + "0", false},
		{"e2b_" + strings.ToUpper(hex40), false},
		{"E2B_" + hex40, false},
		{"e2c_" + hex40, false},
		{"sk_e2b_" + hex40[:37], false},
		{"e2b_" + hex40[:39] + "g", false},
		{"e2b_" + hex40[:39] + " ", false},
	} {
		if got := auth.ValidKey(tt.key); got != tt.want {
			t.Errorf("ValidKey(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
}

func TestHash(t *testing.T) {
	// printf %s e2b_0000000000000000000000000000000000000000 | sha256sum
	const want = "6aa1fc737ae695d4574acd499f9ec1cc63a1d245f89b676451e5db329ce22c0c"
	if got := auth.Hash("e2b_" + strings.Repeat("0", 40)); got != want {
		t.Fatalf("Hash = %s, want %s", got, want)
	}
}
