// Package loopback hands out loopback addresses for the servers a test, a
// benchmark or a local system starts.
package loopback

import (
	"fmt"
	"net"
	"sync"
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
	// pick binds port 0 and returns the port the kernel chose, released.
	pick = func() (int, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
)

// FreeAddr returns 127.0.0.1 with a port that was free a moment ago and
// that no earlier call in this process returned. A port is found by
// binding port 0 and released for the server that binds it later; the
// kernel may choose a released port again before then, and two servers of
// one test were given the same port so (the second failed to listen).
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
