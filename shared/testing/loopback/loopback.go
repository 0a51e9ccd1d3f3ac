// Package loopback hands out loopback addresses for the servers a test, a
// benchmark or a local system starts.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
	// pick returns a port that was free a moment ago, released.
	pick = func() (int, error) {
		if r, ok := belowEphemeral(); ok {
			for range 100 {
				port := r.lo + rand.IntN(r.hi-r.lo) //nolint:gosec // a port, not a secret
				if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
					_ = l.Close()
					return port, nil
				}
			}
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
)

// lowestPort is the lowest port FreeAddr hands out: past the ports well
// known services listen on.
const lowestPort = 10000

// belowEphemeral is the range of ports [lo, hi) between lowestPort and
// the kernel's ephemeral ports (net.ipv4.ip_local_port_range), which the
// kernel never gives a socket by itself, if it holds a thousand. It is
// read once.
var belowEphemeral = sync.OnceValues(func() (r portRange, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return r, false
	}
	var first int
	if _, err := fmt.Sscan(string(b), &first); err != nil || first-lowestPort < 1000 {
		return r, false
	}
	return portRange{lo: lowestPort, hi: first}, true
})

// portRange is the ports [lo, hi).
type portRange struct{ lo, hi int }

// FreeAddr returns 127.0.0.1 with a port that was free a moment ago and
// that no earlier call in this process returned. The port is released for
// the server that binds it later, so it is taken from below the kernel's
// ephemeral ports where it can: there the kernel gives it to no other
// socket meanwhile, as it did from the ephemeral range to the client
// connections and port-0 listeners of the tests running beside (a
// sandboxd of one test failed to listen on a port found so). Only another
// process choosing the same port at random in the same moment can take
// it. Within this process no port is handed out twice.
func FreeAddr() (string, error) {
	const tries = 100
	for range tries {
		port, err := pick()
		if err != nil {
			return "", err
		}
		mu.Lock()
		fresh := !given[port]
		given[port] = true
		mu.Unlock()
		if fresh {
			return fmt.Sprintf("127.0.0.1:%d", port), nil
		}
	}
	return "", fmt.Errorf("no loopback port in %d tries that this process had not handed out already", tries)
}
