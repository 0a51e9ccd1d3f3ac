package network

import (
	"context"
	"net"
	"net/netip"

	"github.com/vishvananda/netns"
)

// DialLoopback connects to port on the loopback (127.0.0.1) of the network
// namespace pinned at netnsPath: a server that a sandbox binds to 127.0.0.1
// only, which its own address does not reach (e2b's envd forwards such a
// port with socat, from the sandbox's address to its loopback).
//
// The socket is made on a thread locked in that namespace (onNSThread),
// which then returns to its own; a socket stays in the namespace it was
// made in, so the connection works from any thread afterwards. Under
// gVisor the sandbox's loopback is in its netstack, not in the namespace
// the host sees, and this is refused.
func DialLoopback(ctx context.Context, netnsPath string, port uint16) (net.Conn, error) {
	var c net.Conn
	err := onNSThread(enterPath(netnsPath), func(netns.NsHandle) error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp4", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port).String())
		return err
	})
	return c, err
}
