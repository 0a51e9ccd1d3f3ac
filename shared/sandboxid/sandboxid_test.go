package sandboxid

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"testing/iotest"
)

func TestNodeTag(t *testing.T) {
	a, b := NodeTag("sandbox-host-1"), NodeTag("sandbox-host-2")
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	if a != NodeTag("sandbox-host-1") {
		t.Fatal("NodeTag is not stable")
	}
	if a == b {
		t.Fatalf("two node names share tag %q (possible, but not for these two)", a)
	}
	// Tags spread: 1,000 node names give (almost) 1,000 tags.
	seen := map[Tag]bool{}
	for i := range 1000 {
		seen[NodeTag("node-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)))] = true
	}
	if len(seen) < 980 {
		t.Fatalf("1000 node names gave %d tags", len(seen))
	}
}

func TestNewAndParse(t *testing.T) {
	tag := NodeTag("n1")
	seen := map[string]bool{}
	for range 10000 {
		id, err := New(tag)
		if err != nil {
			t.Fatal(err)
		}
		if len(id) != Len || !inAlphabet(id) {
			t.Fatalf("New = %q, want %d characters of [a-z0-9]", id, Len)
		}
		got, err := Parse(id)
		if err != nil || got != tag {
			t.Fatalf("Parse(%q) = %q, %v; want tag %q", id, got, err, tag)
		}
		if seen[id] {
			t.Fatalf("New returned %q twice", id)
		}
		seen[id] = true
	}
	if _, err := New("BAD!"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("New(bad tag) = %v, want ErrInvalid", err)
	}
}

func TestParseRejects(t *testing.T) {
	for _, id := range []string{
		"", "abc", strings.Repeat("a", Len-1), strings.Repeat("a", Len+1),
		"ABCDEFGHIJ0123456789", "abcdefghij012345678-", "abcdefghij01234567\x00a", "abcdefghij0123456é",
	} {
		if _, err := Parse(id); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid", id, err)
		}
		if Valid(id) {
			t.Errorf("Valid(%q) = true", id)
		}
	}
	if !Valid("abcdefghij0123456789") {
		t.Error(`Valid("abcdefghij0123456789") = false`)
	}
}

// Every character is equally likely: bytes at or above the largest multiple
// of 36 are drawn again, never folded onto the first characters.
func TestNewIsUnbiased(t *testing.T) {
	// 252..255 would map to a..d with a plain modulo; they must be skipped.
	biased := bytes.Repeat([]byte{252, 253, 254, 255}, 8)
	var src bytes.Buffer
	src.Write(biased)
	for i := range 64 {
		src.WriteByte(byte(35 + 36*(i%7))) // all map to '9'
	}
	id, err := newFrom(&src, "tttt")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("9", Len-TagLen) + "tttt"; id != want {
		t.Fatalf("id = %q, want %q", id, want)
	}

	counts := map[byte]int{}
	for range 2000 {
		id, err := New("tttt")
		if err != nil {
			t.Fatal(err)
		}
		for i := range Len - TagLen {
			counts[id[i]]++
		}
	}
	// 32,000 draws over 36 characters: about 889 each. A modulo bias
	// would put a..d near 1,000; allow a wide margin for chance.
	for c, n := range counts {
		if n < 700 || n > 1080 {
			t.Errorf("character %q drawn %d times of 32000, want about 889", c, n)
		}
	}
	if len(counts) != len(alphabet) {
		t.Errorf("drew %d distinct characters, want %d", len(counts), len(alphabet))
	}
}

func TestNewRandomFailure(t *testing.T) {
	if _, err := newFrom(iotest.ErrReader(errors.New("no entropy")), "tttt"); err == nil || !strings.Contains(err.Error(), "no entropy") {
		t.Fatalf("newFrom(failing reader) = %v", err)
	}
}

// Parse never panics, and accepts exactly 20 characters of [a-z0-9].
func FuzzParse(f *testing.F) {
	for _, s := range []string{"abcdefghij0123456789", "", "ABCDEFGHIJ0123456789", "abcdefghij012345678\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		tag, err := Parse(id)
		if err != nil {
			return
		}
		if len(id) != Len || tag.Validate() != nil || string(tag) != id[Len-TagLen:] {
			t.Fatalf("Parse(%q) accepted, tag %q", id, tag)
		}
	})
}

func TestAccessToken(t *testing.T) {
	id, err := New(NodeTag("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	tok, tok2 := NewAccessToken(id), NewAccessToken(id)
	if tok == tok2 {
		t.Fatal("two tokens for one sandbox are equal")
	}
	if got, ok := FromAccessToken(tok); !ok || got != id {
		t.Fatalf("FromAccessToken(%q) = %q, %v; want %q", tok, got, ok, id)
	}
	for _, bad := range []string{
		"", id, id + ".", id + "." + strings.Repeat("a", 63), id + "." + strings.Repeat("A", 64),
		"NOTANID." + strings.Repeat("a", 64), strings.Repeat("a", 64), // an old-style token: hex only
		id + "." + strings.Repeat("a", 64) + "x",
	} {
		if got, ok := FromAccessToken(bad); ok {
			t.Errorf("FromAccessToken(%q) = %q, true; want false", bad, got)
		}
	}
}

func FuzzFromAccessToken(f *testing.F) {
	f.Add("k3x9q2m7v1p8z0c4t7fa." + strings.Repeat("0", 64))
	f.Add("")
	f.Add("a.b")
	f.Fuzz(func(t *testing.T, tok string) {
		id, ok := FromAccessToken(tok)
		if ok && (!Valid(id) || !strings.HasPrefix(tok, id+".")) {
			t.Fatalf("FromAccessToken(%q) = %q, true", tok, id)
		}
	})
}
