package egressproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS is the DNS filter for redirected queries.
type DNS struct {
	o Options
}

// NewDNS returns a filter; ServeUDP and ServeTCP run it.
func NewDNS(o Options) *DNS {
	o.defaults()
	return &DNS{o: o}
}

// queryTimeout bounds one query to the host's resolver.
const queryTimeout = 5 * time.Second

// maxQueries bounds the queries the filter answers at once (UDP, and TCP
// connections), for all sandboxes, a sixteenth of them (256) for one and
// a quarter (1,024) for one team's; a query over it is dropped, as a busy
// resolver would, and the client asks again (after about 5 s: a crawler's
// parallel lookups stay under it).
const maxQueries = 4096

// ServeUDP answers the queries that reach pc until ctx ends.
func (d *DNS) ServeUDP(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { _ = pc.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := newShares(maxQueries, d.o.TeamShare, d.o.Sandboxes.Team)
	var full refusals
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		src, ok := addrOf(from)
		if !ok {
			continue
		}
		team, r := slots.take(src)
		if r != taken {
			full.log(d.o.Logger, r, "DNS filter (UDP)", src, team, slots)
			continue // dropped, as a busy resolver would
		}
		query := append([]byte(nil), buf[:n]...)
		wg.Go(func() {
			defer slots.put(src, team)
			if ans := d.answer(ctx, src, query, "udp"); ans != nil {
				_, _ = pc.WriteTo(ans, from)
			}
		})
	}
}

// ServeTCP answers the queries of the connections ln takes until ctx
// ends.
func (d *DNS) ServeTCP(ctx context.Context, ln net.Listener) error {
	return serveConns(ctx, ln, newShares(maxQueries, d.o.TeamShare, d.o.Sandboxes.Team), d.o.Logger, "DNS filter", func(c net.Conn) {
		src, ok := addrOf(c.RemoteAddr())
		if !ok {
			return
		}
		for {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			query, err := readTCPMessage(c)
			if err != nil {
				return
			}
			ans := d.answer(ctx, src, query, "tcp")
			if ans == nil || writeTCPMessage(c, ans) != nil {
				return
			}
		}
	})
}

func addrOf(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	}
	return netip.Addr{}, false
}

// answer is the reply to query from the sandbox at src: the host
// resolver's, when every name asked is allowed, else REFUSED. nil drops
// the query (unparsable, or the resolver did not answer).
func (d *DNS) answer(ctx context.Context, src netip.Addr, query []byte, network string) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil
	}
	rules, known := d.o.Sandboxes.Get(src)
	allowed := known && len(qs) > 0
	for _, q := range qs {
		if !rules.AllowsName(q.Name.String()) {
			allowed = false
		}
	}
	if !allowed {
		d.o.Logger.Debug("DNS filter: refused", "sandbox_addr", src, "questions", len(qs))
		return refused(h, qs)
	}
	ans, err := d.forward(ctx, query, network)
	if err != nil {
		d.o.Logger.Debug("DNS filter: the host's resolver did not answer", "error", err)
		return nil
	}
	return ans
}

// refused is a REFUSED answer to a query with header h and questions qs.
func refused(h dnsmessage.Header, qs []dnsmessage.Question) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
		RecursionAvailable: true, RCode: dnsmessage.RCodeRefused,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil
	}
	for _, q := range qs {
		if err := b.Question(q); err != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// forward asks the host's resolvers, one after another, over network.
func (d *DNS) forward(ctx context.Context, query []byte, network string) ([]byte, error) {
	rs := d.o.Resolvers()
	if len(rs) == 0 {
		return nil, errors.New("no resolver")
	}
	var last error
	for _, r := range rs {
		ans, err := ask(ctx, netip.AddrPortFrom(r, d.o.ResolverPort), query, network)
		if err == nil {
			return ans, nil
		}
		last = err
	}
	return nil, last
}

func ask(ctx context.Context, server netip.AddrPort, query []byte, network string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var dl net.Dialer
	c, err := dl.DialContext(ctx, network, server.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if network == "tcp" {
		if err := writeTCPMessage(c, query); err != nil {
			return nil, err
		}
		return readTCPMessage(c)
	}
	if _, err := c.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// readTCPMessage reads one length-prefixed DNS message.
func readTCPMessage(r io.Reader) ([]byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

func writeTCPMessage(w io.Writer, msg []byte) error {
	if len(msg) > 65535 {
		return errors.New("DNS message too long")
	}
	out := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(out, uint16(len(msg)))
	copy(out[2:], msg)
	_, err := w.Write(out)
	return err
}
