package relay

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxtest"
)

// listenInNS listens on addr from a socket made in the namespace at path
// (it stays there), until the test ends.
func listenInNS(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	var err error
	sandboxtest.InNetns(t, path, func() { l, err = net.Listen("tcp4", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// freePort returns a port nothing on the host's 127.0.0.1 listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return portOf(t, "http://"+l.Addr().String())
}

// serve answers "from <name>" on l until the test ends.
func serve(t *testing.T, l net.Listener, name string) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "from "+name)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

func getPort(t *testing.T, relayURL, port string) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(request(t, http.MethodGet, relayURL, "/", port, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A server that the sandbox binds to 127.0.0.1 is reached through its port
// URL, as e2b makes it (socat, from the sandbox's address to its
// loopback): the sandbox's address refuses, and the relay dials the
// loopback of the sandbox's namespace.
func TestLoopbackServerReached(t *testing.T) {
	sandboxtest.RequireRoot(t)
	ns := sandboxtest.Netns(t)
	port := freePort(t) // refused at the sandbox's "address", the host's 127.0.0.1
	serve(t, listenInNS(t, ns, "127.0.0.1:"+port), "the sandbox's loopback")
	relay, res := startRelay(t)
	res.set(sandboxID, Sandbox{Address: "127.0.0.1", NetNS: ns})
	if code, body := getPort(t, relay.URL, port); code != http.StatusOK || body != "from the sandbox's loopback" {
		t.Fatalf("a server on the sandbox's 127.0.0.1: %d %q, want 200 from it", code, body)
	}
	// A second request reuses the kept connection, or dials it again.
	if code, body := getPort(t, relay.URL, port); code != http.StatusOK || body != "from the sandbox's loopback" {
		t.Fatalf("the second request: %d %q", code, body)
	}
	// The sandbox's address still comes first: a server there answers.
	other := freePort(t)
	l, err := net.Listen("tcp4", "127.0.0.1:"+other)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, "the sandbox's address")
	serve(t, listenInNS(t, ns, "127.0.0.1:"+other), "the sandbox's loopback")
	if code, body := getPort(t, relay.URL, other); code != http.StatusOK || body != "from the sandbox's address" {
		t.Fatalf("a port on both: %d %q, want the address's", code, body)
	}
}

// A port that refuses is dialled again for about a second (e2b's proxy
// tries 5 times, 100 to 400 ms apart): a server still starting is reached
// once it listens, also when the loopback dial fails for another reason
// (under gVisor the host cannot reach the sandbox's loopback; here: no
// such namespace). A port that keeps refusing gets the 502 after the last
// try.
func TestRefusedPortRetried(t *testing.T) {
	relay, res := startRelay(t)
	for _, sb := range []Sandbox{
		{Address: "127.0.0.1"},
		{Address: "127.0.0.1", NetNS: filepath.Join(t.TempDir(), "no-namespace")},
	} {
		t.Run(fmt.Sprintf("netns %q", sb.NetNS), func(t *testing.T) {
			res.set(sandboxID, sb)
			port := freePort(t)
			started := make(chan struct{})
			go func() {
				defer close(started)
				time.Sleep(300 * time.Millisecond)
				l, err := net.Listen("tcp4", "127.0.0.1:"+port)
				if err != nil {
					t.Errorf("listen late: %v", err)
					return
				}
				serve(t, l, "a late server")
			}()
			code, body := getPort(t, relay.URL, port)
			<-started
			if code != http.StatusOK || body != "from a late server" {
				t.Fatalf("a server that listens 300 ms late: %d %q, want 200 from it", code, body)
			}
		})
	}

	port := freePort(t)
	begin := time.Now()
	code, body := getPort(t, relay.URL, port)
	took := time.Since(begin)
	if code != http.StatusBadGateway {
		t.Fatalf("a port that keeps refusing: %d %q, want 502", code, body)
	}
	var wait time.Duration
	for _, d := range refusedBackoff {
		wait += d
	}
	if took < wait || took > wait+5*time.Second {
		t.Errorf("the 502 came after %s; want it after the retries' %s", took, wait)
	}
}
