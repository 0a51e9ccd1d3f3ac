package fairslots

import "testing"

// One key takes its share and no more; the others take what is left, and
// what a key gives back is taken again.
func TestShares(t *testing.T) {
	s := New[string](5, 2)
	for i, want := range []Refusal{Taken, Taken, KeyFull} {
		if got := s.Take("a"); got != want {
			t.Fatalf("a's take %d: %v, want %v", i+1, got, want)
		}
	}
	for i, want := range []Refusal{Taken, Taken, KeyFull} {
		if got := s.Take("b"); got != want {
			t.Fatalf("b's take %d: %v, want %v", i+1, got, want)
		}
	}
	if got := s.Take("c"); got != Taken {
		t.Fatalf("c's first take: %v, want it taken", got)
	}
	if got := s.Take("d"); got != AllFull {
		t.Fatalf("d's take with every slot held: %v, want AllFull", got)
	}
	s.Put("a")
	if got := s.Take("d"); got != Taken {
		t.Fatalf("d's take after a gave one back: %v, want it taken", got)
	}
	if got := s.Take("a"); got != AllFull {
		t.Fatalf("a's take with every slot held: %v, want AllFull", got)
	}
	s.Put("a")
	s.Put("a")
	if len(s.held) != 3 || s.used != 3 {
		t.Fatalf("after a gave back both: %d keys hold %d slots, want 3 and 3", len(s.held), s.used)
	}
	if got := s.Take("a"); got != Taken {
		t.Fatalf("a's take after giving both back: %v", got)
	}
}
