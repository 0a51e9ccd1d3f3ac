package hosttest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/shared/testing/forwardtest"
)

// Netns is a network namespace of a test's own, joined to this machine's
// namespace by a veth pair with a /30: the namespace end has Addr, this
// machine's end Gateway. Nothing routes beyond the pair, so what runs
// inside reaches this machine's Gateway address only, and this machine
// reaches Addr. It is deleted, with the pair, when the test ends.
type Netns struct {
	// Name is the namespace's name under /run/netns (ip netns).
	Name string
	// Path is its file, for nsenter --net.
	Path string
	// Addr is the namespace end's address, Gateway this machine's end's.
	Addr, Gateway string
}

// Subnet returns a random third octet for a test's 10.250.N.0/24, out of
// which NewNetns takes /30s, one that no interface of this machine has an
// address in: tests running side by side (the fleet lanes beside the SDK
// suite's outbound-rules servers, in make test) must not pick the same,
// or one's routes hide the other's addresses for as long as both run.
func Subnet() int {
	used := map[int]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip := ipn.IP.To4(); ip != nil && ip[0] == 10 && ip[1] == 250 {
					used[int(ip[2])] = true
				}
			}
		}
	}
	for range 64 {
		if n := rand.IntN(256); !used[n] {
			return n
		}
	}
	return rand.IntN(256)
}

// NewNetns makes namespace name (a few letters: it names the namespace and
// the veth, with a random suffix) with the index-th /30 of 10.250.subnet.0/24
// (index 0 to 63).
func NewNetns(t testing.TB, name string, subnet, index int) *Netns {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip is needed (apt-get install iproute2)")
	}
	suffix := fmt.Sprintf("%03x", rand.IntN(0xfff))
	n := &Netns{Name: "skiff-" + name + "-" + suffix, Addr: fmt.Sprintf("10.250.%d.%d", subnet, 4*index+2),
		Gateway: fmt.Sprintf("10.250.%d.%d", subnet, 4*index+1)}
	n.Path = "/run/netns/" + n.Name
	veth := "sk" + name[:min(len(name), 6)] + suffix // at most 11 of IFNAMSIZ's 15
	run(t, "ip", "netns", "add", n.Name)
	t.Cleanup(func() {
		// Deleting the namespace ends its veth end, and so the pair.
		if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", n.Name, err, out)
		}
		_ = exec.Command("ip", "link", "del", veth).Run()
	})
	run(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.Name)
	run(t, "ip", "addr", "add", n.Gateway+"/30", "dev", veth)
	run(t, "ip", "link", "set", veth, "up")
	run(t, "ip", "-n", n.Name, "addr", "add", n.Addr+"/30", "dev", "eth0")
	run(t, "ip", "-n", n.Name, "link", "set", "eth0", "up")
	run(t, "ip", "-n", n.Name, "link", "set", "lo", "up")
	return n
}

// Route sends the namespace's traffic for prefix (e.g. the other test
// hosts' 10.250.N.0/24) through this machine, which forwards it: hosts of
// one subnet then reach each other, as a fleet's hosts do. It turns on
// this machine's IPv4 forwarding (net.ipv4.ip_forward) while the test
// runs, through forwardtest, which puts the machine's own value back
// after the last test that needs it. (Off, as on a fresh machine where no
// sandboxd has run yet, one host's requests to another vanish: a pull
// of a snapshot from another host hung until its caller gave up.)
func (n *Netns) Route(t testing.TB, prefix string) {
	t.Helper()
	forwardtest.Keep(t)
	const forward = "/proc/sys/net/ipv4/ip_forward"
	if b, err := os.ReadFile(forward); err != nil || strings.TrimSpace(string(b)) != "1" {
		if err := os.WriteFile(forward, []byte("1"), 0o644); err != nil {
			t.Fatalf("turn on IPv4 forwarding, which routes between the test's hosts: %v", err)
		}
	}
	run(t, "ip", "-n", n.Name, "route", "add", prefix, "via", n.Gateway)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// Command returns cmd's program and arguments run inside the namespace
// (through util-linux's nsenter, which execs it: the PID is the program's).
func (n *Netns) Command(bin string, args ...string) (string, []string) {
	return "nsenter", append([]string{"--net=" + n.Path, "--", bin}, args...)
}

// Listen opens a TCP listener inside the namespace, on addr (host:port).
// The listener is used from any goroutine like any other.
func (n *Netns) Listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := n.in(func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// Dial opens a TCP connection from inside the namespace to addr (its
// loopback's, say: a daemon's admin endpoint), as an http.Transport's
// DialContext.
func (n *Netns) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.in(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// ListenPacket opens a UDP socket inside the namespace, on addr.
func (n *Netns) ListenPacket(addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := n.in(func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	return pc, err
}

// in runs fn on a thread inside the namespace (to open sockets there,
// which stay there), then takes the thread back to this process's
// namespace. The thread must not end: a process this test started from it
// (kubetest's etcd and kube-apiserver run under setpriv --pdeathsig KILL,
// which fires when the parent thread ends) would be killed with it. Only
// when the way back fails is the thread left locked, to end with its
// goroutine.
func (n *Netns) in(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer home.Close()
		f, err := os.Open(n.Path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter %s: %w", n.Name, err)
			return
		}
		err = fn()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// Forwarder accepts TCP connections on a listener and relays each to a
// target address: a way into this machine's loopback (a control plane's)
// from inside a namespace. Cut ends every relayed connection and refuses
// new ones until Restore, as a network partition would.
type Forwarder struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Forward relays connections to addr inside n (e.g. 127.0.0.1:6443) to
// target on this machine, until the test ends.
func (n *Netns) Forward(t testing.TB, addr, target string) *Forwarder {
	t.Helper()
	l, err := n.Listen(addr)
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, n.Name, err)
	}
	f := &Forwarder{l: l, target: target, conns: map[net.Conn]struct{}{}}
	f.wg.Go(f.serve)
	t.Cleanup(func() {
		_ = l.Close()
		f.Cut()
		f.wg.Wait()
	})
	return f
}

func (f *Forwarder) serve() {
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			continue
		}
		f.wg.Go(func() { f.relay(c) })
	}
}

// track records c to be closed by Cut, or closes it when cut already.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

// untrack forgets c and closes it.
func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	_ = c.Close()
}

func (f *Forwarder) relay(c net.Conn) {
	defer f.untrack(c)
	var d net.Dialer
	up, err := d.DialContext(context.Background(), "tcp", f.target)
	if err != nil || !f.track(up) {
		return
	}
	defer f.untrack(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

// Cut ends every relayed connection and refuses new ones.
func (f *Forwarder) Cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = true
	for c := range f.conns {
		_ = c.Close()
	}
}

// Restore accepts connections again.
func (f *Forwarder) Restore() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = false
}
