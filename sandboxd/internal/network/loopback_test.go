package network

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/fairslots"
)

// newNS makes a network namespace with its lo up, pinned at a file in the
// test's temporary directory, and removes it when the test ends (failed
// or not).
func newNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	path := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeNS(path); err != nil {
			t.Error(err)
		}
	})
	err := onNSThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func(netns.NsHandle) error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// DialLoopback reaches a server bound to 127.0.0.1 inside a namespace,
// which the host's own 127.0.0.1 does not, and the connection keeps
// working from the caller's goroutine (another thread, in the host's
// namespace). A port nothing listens on in the namespace is refused, and a
// path that is no namespace is an error.
func TestDialLoopback(t *testing.T) {
	ns := newNS(t)
	l := listenInAt(t, ns, netip.MustParseAddrPort("127.0.0.1:0"))
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	if c, err := net.DialTimeout("tcp4", l.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Skipf("the host has a server of its own at %s", l.Addr())
	}

	ctx := t.Context()
	c, err := DialLoopback(ctx, ns, port)
	if err != nil {
		t.Fatalf("dial the namespace's loopback: %v", err)
	}
	defer c.Close()
	in, ok := acceptConn(l, 5*time.Second)
	if !ok {
		t.Fatal("the namespace's server saw no connection")
	}
	defer in.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_ = in.SetDeadline(time.Now().Add(5 * time.Second))
	for i := range 20 { // the runtime moves this goroutine between threads at will
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(in, got); err != nil || string(got) != "ping" {
			t.Fatalf("read %d: %q, %v", i, got, err)
		}
		time.Sleep(time.Millisecond)
	}

	l.Close()
	if _, err := DialLoopback(ctx, ns, port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial of a closed port in the namespace = %v, want ECONNREFUSED", err)
	}
	if _, err := DialLoopback(ctx, filepath.Join(t.TempDir(), "none"), port); err == nil {
		t.Error("dial through a namespace that does not exist succeeded")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := DialLoopback(cancelled, ns, port); err == nil {
		t.Error("dial with a cancelled context succeeded")
	}
}

// A server listening on ::1 only (Node's "localhost") is reached too, as
// e2b's envd forwards it.
func TestDialLoopbackIPv6(t *testing.T) {
	ns := newNS(t)
	l := listenInAt(t, ns, netip.MustParseAddrPort("[::1]:0"))
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	c, err := DialLoopback(t.Context(), ns, port)
	if err != nil {
		t.Fatalf("dial the namespace's ::1: %v", err)
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != l.Addr().String() {
		t.Errorf("connected to %s, want %s", got, l.Addr())
	}
}

// The dials under way are capped, and one sandbox holds at most its share
// of them: each holds an OS thread while it waits. A sandbox at its share
// is refused; another is not.
func TestDialLoopbackBusy(t *testing.T) {
	ns, other := newNS(t), newNS(t)
	for range 32 {
		if loopbackDials.Take(ns) != fairslots.Taken {
			t.Fatal("a sandbox's first 32 dials were refused")
		}
	}
	defer func() {
		for range 32 {
			loopbackDials.Put(ns)
		}
	}()
	if _, err := DialLoopback(t.Context(), ns, 1); !errors.Is(err, ErrLoopbackBusy) {
		t.Errorf("a dial of a sandbox holding its share = %v, want ErrLoopbackBusy", err)
	}
	if _, err := DialLoopback(t.Context(), other, 1); errors.Is(err, ErrLoopbackBusy) {
		t.Errorf("another sandbox's dial = %v, want it tried", err)
	}
}
