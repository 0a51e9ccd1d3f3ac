package network

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The kernel's TCP metrics cache (linux/tcp_metrics.h): per network
// namespace, what TCP learned of each peer address (RTT, ssthresh),
// written when a connection closes. The host's namespace learns an entry
// for every sandbox address sandboxd (or the envd proxy through it) ever
// talked to, and the pool is handed out round robin, so a busy host ends
// up with one for every address of the pool. The cache is one table for
// all namespaces, and each namespace's end walks all of it (in
// tcp_metrics_flush_all, a lock per bucket): with tens of thousands of
// entries, 3% of the host's CPU at 40 sandbox lifecycles a second. So
// Teardown forgets the sandbox's address, and Init the addresses of the
// pool that no sandbox holds.
const (
	tcpMetricsFamily     = "tcp_metrics"
	tcpMetricsVersion    = 1
	tcpMetricsCmdGet     = 1
	tcpMetricsCmdDel     = 2
	tcpMetricsAttrAddrV4 = 1
)

var tcpMetricsID = sync.OnceValues(func() (uint16, error) {
	f, err := netlink.GenlFamilyGet(tcpMetricsFamily)
	if err != nil {
		return 0, fmt.Errorf("generic netlink family %s: %w", tcpMetricsFamily, err)
	}
	return f.ID, nil
})

// forgetTCPMetrics deletes the entries of this network namespace's TCP
// metrics cache for peer address addr; there being none is no error.
func forgetTCPMetrics(addr netip.Addr) error {
	id, err := tcpMetricsID()
	if err != nil {
		return err
	}
	req := nl.NewNetlinkRequest(int(id), unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: tcpMetricsCmdDel, Version: tcpMetricsVersion})
	a := addr.As4()
	req.AddData(nl.NewRtAttr(tcpMetricsAttrAddrV4, a[:]))
	if _, err := req.Execute(unix.NETLINK_GENERIC, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("forget TCP metrics of %s: %w", addr, err)
	}
	return nil
}

// tcpMetricsPeers lists the IPv4 peer addresses of this network
// namespace's TCP metrics cache.
func tcpMetricsPeers() ([]netip.Addr, error) {
	id, err := tcpMetricsID()
	if err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(int(id), unix.NLM_F_DUMP)
	req.AddData(&nl.Genlmsg{Command: tcpMetricsCmdGet, Version: tcpMetricsVersion})
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return nil, fmt.Errorf("list TCP metrics: %w", err)
	}
	var out []netip.Addr
	for _, m := range msgs {
		if len(m) < nl.SizeofGenlmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
		if err != nil {
			return nil, fmt.Errorf("list TCP metrics: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type == tcpMetricsAttrAddrV4 && len(a.Value) == 4 {
				out = append(out, netip.AddrFrom4([4]byte(a.Value)))
			}
		}
	}
	return out, nil
}
