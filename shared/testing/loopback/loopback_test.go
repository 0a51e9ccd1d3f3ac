package loopback

import (
	"fmt"
	"net"
	"testing"
)

// A port the kernel chooses again is not handed out twice.
func TestFreeAddrNeverRepeatsAPort(t *testing.T) {
	ports := []int{40001, 40001, 40002}
	real := pick
	t.Cleanup(func() { pick = real })
	pick = func() (int, error) {
		p := ports[0]
		ports = ports[1:]
		return p, nil
	}
	a, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	b, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	if a != "127.0.0.1:40001" || b != "127.0.0.1:40002" {
		t.Fatalf("FreeAddr gave %s then %s, want 127.0.0.1:40001 then 127.0.0.1:40002", a, b)
	}
}

// The address is one a server can listen on.
func TestFreeAddrListens(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	_ = l.Close()
}

// The port is below the kernel's ephemeral ports, which the kernel gives
// client connections and port-0 listeners by itself.
func TestFreeAddrBelowEphemeral(t *testing.T) {
	r, ok := belowEphemeral()
	lo, hi := r.lo, r.hi
	if !ok {
		t.Skip("this machine's ephemeral ports leave no room below them")
	}
	for range 20 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(addr)
		var port int
		if _, err := fmt.Sscan(p, &port); err != nil || port < lo || port >= hi {
			t.Fatalf("FreeAddr gave %s, want a port in [%d, %d)", addr, lo, hi)
		}
	}
}
