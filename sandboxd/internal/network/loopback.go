package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"

	"github.com/skiff-dev/skiff/sandboxd/internal/fairslots"
)

// LoopbackDialTimeout bounds one DialLoopback. A loopback connect answers at
// once unless the server's accept queue is full, when the kernel drops the
// SYN and connect would wait minutes on a thread locked in the namespace.
const LoopbackDialTimeout = 2 * time.Second

// loopbackDials caps the DialLoopbacks under way: each holds an OS thread
// for as long as it waits, and a sandbox's own server decides how long that
// is, so without a cap enough requests to one port URL would take sandboxd
// to Go's limit of 10,000 threads. One sandbox holds at most 32 of the 256:
// a server whose accept queue is full holds each dial for the whole
// LoopbackDialTimeout, and one sandbox that held them all would leave every
// other sandbox's loopback servers unreachable. 32 is what all sandboxes
// shared before, which a page's burst of new connections to a dev server
// needs (4 turned a burst of 64 into 502s).
var loopbackDials = fairslots.New[string](256, 32)

// ErrLoopbackBusy is DialLoopback's error when the sandbox holds its share
// of loopbackDials, or all are taken.
var ErrLoopbackBusy = errors.New("too many loopback dials under way")

// DialLoopback connects to port on the loopback of the network namespace
// pinned at netnsPath, 127.0.0.1 and then ::1: a server that a sandbox binds
// to the loopback only, which its own address does not reach (e2b's envd
// forwards such a port from the sandbox's address to 127.0.0.1, or to ::1
// for a server listening there only, as Node's "localhost" does).
//
// The socket is made on a thread locked in that namespace (onNSThread),
// which then returns to its own; a socket stays in the namespace it was
// made in, so the connection works from any thread afterwards. Under
// gVisor the sandbox's loopback is in its netstack, not in the namespace
// the host sees, and this is refused.
func DialLoopback(ctx context.Context, netnsPath string, port uint16) (net.Conn, error) {
	if loopbackDials.Take(netnsPath) != fairslots.Taken {
		return nil, ErrLoopbackBusy
	}
	defer loopbackDials.Put(netnsPath)
	ctx, cancel := context.WithTimeout(ctx, LoopbackDialTimeout)
	defer cancel()
	var c net.Conn
	err := onNSThread(enterPath(netnsPath), func(netns.NsHandle) error {
		var d net.Dialer
		var errs []error
		for _, a := range []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()} {
			var err error
			if c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String()); err == nil {
				return nil
			}
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return nil, fmt.Errorf("dial the loopback of %s: %w", netnsPath, err)
	}
	return c, nil
}
