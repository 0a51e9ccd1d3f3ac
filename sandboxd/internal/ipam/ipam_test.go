package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

func TestNewValidates(t *testing.T) {
	for _, cidr := range []string{"", "10.0.0.0", "fd00::/64", "10.0.0.0/30", "10.0.0.0/32", "10.0.0.0/7", "nonsense/16"} {
		if _, err := New(cidr); err == nil {
			t.Errorf("New(%q) succeeded", cidr)
		}
	}
	p, err := New("10.200.0.7/24") // host bits are masked off
	if err != nil || p.Size() != 64 {
		t.Fatalf("New(/24) = %v, %v; want 64 blocks", p, err)
	}
}

func TestAllocate(t *testing.T) {
	p, err := New("10.200.0.0/28")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []Block
	for i := range 4 {
		b, err := p.Allocate(fmt.Sprint("s", i))
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, b)
	}
	if b := blocks[1]; b.Prefix.String() != "10.200.0.4/30" || b.Host.String() != "10.200.0.5" || b.Sandbox.String() != "10.200.0.6" {
		t.Fatalf("second block = %+v", b)
	}
	if again, _ := p.Allocate("s2"); again != blocks[2] {
		t.Fatalf("Allocate of an owner with a block = %+v, want its block %+v", again, blocks[2])
	}
	if _, err := p.Allocate("s4"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate beyond the pool = %v, want ErrExhausted", err)
	}
	// Freed blocks come back last: round-robin.
	p.Release("s0")
	p.Release("s1")
	p.Release("nobody")
	b, _ := p.Allocate("s5")
	if b != blocks[0] {
		t.Fatalf("after releasing s0 and s1, got %v, want s0's block first (the cursor wrapped)", b.Prefix)
	}
	b, _ = p.Allocate("s6")
	if b != blocks[1] {
		t.Fatalf("got %v, want s1's block", b.Prefix)
	}
}

func TestClaim(t *testing.T) {
	p, _ := New("10.200.0.0/24")
	b, err := p.Claim("old", netip.MustParseAddr("10.200.0.42"))
	if err != nil || b.Prefix.String() != "10.200.0.40/30" || b.Sandbox.String() != "10.200.0.42" {
		t.Fatalf("Claim = %+v, %v", b, err)
	}
	if _, err := p.Claim("other", netip.MustParseAddr("10.200.0.41")); !errors.Is(err, ErrInUse) {
		t.Fatalf("Claim of a held block = %v, want ErrInUse", err)
	}
	if _, err := p.Claim("x", netip.MustParseAddr("10.201.0.1")); err == nil {
		t.Fatal("Claim outside the pool succeeded")
	}
	// Allocation never hands out a claimed block.
	for i := range 63 {
		b, err := p.Allocate(fmt.Sprint("n", i))
		if err != nil {
			t.Fatal(err)
		}
		if b.Prefix.String() == "10.200.0.40/30" {
			t.Fatal("allocated the claimed block")
		}
	}
}

func TestConcurrentAllocate(t *testing.T) {
	p, _ := New("10.200.0.0/22") // 256 blocks
	var mu sync.Mutex
	seen := map[netip.Prefix]bool{}
	var wg sync.WaitGroup
	for i := range 256 {
		wg.Go(func() {
			b, err := p.Allocate(fmt.Sprint("s", i))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[b.Prefix] {
				t.Errorf("block %v handed out twice", b.Prefix)
			}
			seen[b.Prefix] = true
		})
	}
	wg.Wait()
	if len(seen) != 256 {
		t.Fatalf("%d distinct blocks, want 256", len(seen))
	}
}
