package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

const (
	// egressSetName is the set of sandbox addresses allowed out.
	egressSetName = "egress"
	// fromSandboxChain holds the forward rules for packets from sandboxes.
	fromSandboxChain = "from_sandbox"
	// egressChain lets out what comes from an address in the egress set.
	egressChain = "egress"

	// IPv4 header offsets.
	ipSrcOffset = 12
	ipDstOffset = 16
)

func (m *Manager) egressSet() *nftables.Set {
	// An explicit ID keeps AddSet from using the library's unsynchronized
	// ID counter.
	return &nftables.Set{Table: m.table, Name: egressSetName, KeyType: nftables.TypeIPAddr, ID: 1}
}

// setEgress adds addr to the egress set or removes it from the set. A
// removal adds and deletes in one transaction, so it succeeds whether or
// not addr was in the set.
func (m *Manager) setEgress(addr netip.Addr, allow bool) error {
	return m.nftBatch(func(cc *nftables.Conn) error {
		set, elem := m.egressSet(), []nftables.SetElement{{Key: addr.AsSlice()}}
		if err := cc.SetAddElements(set, elem); err != nil {
			return err
		}
		if !allow {
			return cc.SetDeleteElements(set, elem)
		}
		return nil
	})
}

// nftBatch has queue queue a batch on the Manager's nftables connection and
// sends it. After an error the connection is dropped, so that neither
// queued messages nor unread replies carry over to the next batch.
func (m *Manager) nftBatch(queue func(*nftables.Conn) error) error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if m.nft == nil {
		cc, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return fmt.Errorf("open nftables: %w", err)
		}
		m.nft = cc
	}
	err := queue(m.nft)
	if err == nil {
		err = m.nft.Flush()
	}
	if err != nil {
		_ = m.nft.CloseLasting()
		m.nft = nil
	}
	return err
}

// writeRules queues the replacement of the table, its sets holding the
// members in kept (by set name). See the package doc and policy.go for
// what the rules do.
func (m *Manager) writeRules(cc *nftables.Conn, kept map[string][]nftables.SetElement) error {
	t := m.table
	forward, input, add := replaceTable(cc, t)
	set := m.egressSet()
	for _, s := range m.keptSets() {
		if err := cc.AddSet(s, kept[s.Name]); err != nil {
			return err
		}
	}
	if err := cc.AddSet(m.rulesMap(), nil); err != nil {
		return err
	}
	fromSandbox := cc.AddChain(&nftables.Chain{Name: fromSandboxChain, Table: t})
	userRules := cc.AddChain(&nftables.Chain{Name: userRulesChain, Table: t})
	egressOK := cc.AddChain(&nftables.Chain{Name: egressChain, Table: t})
	postrouting := cc.AddChain(&nftables.Chain{
		Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	fromSandboxIf := ifname(expr.MetaKeyIIFNAME, m.prefix)
	toSandboxIf := ifname(expr.MetaKeyOIFNAME, m.prefix)

	add(forward, fromSandboxIf, verdict(expr.VerdictGoto, fromSandboxChain))
	add(forward, toSandboxIf, ctReply(), verdict(expr.VerdictAccept, ""))
	add(forward, toSandboxIf, verdict(expr.VerdictDrop, ""))

	drop, toEgress := verdict(expr.VerdictDrop, ""), verdict(expr.VerdictGoto, egressChain)
	ruled := m.ruledSet()
	toUserRules := verdict(expr.VerdictGoto, userRulesChain)
	add(fromSandbox, toSandboxIf, drop)
	add(fromSandbox, notIPv4(), drop)
	add(fromSandbox, spoofed(), drop)
	add(fromSandbox, ipIn(ipDstOffset, m.pool), drop)
	// The resolvers on port 53, then what the operator allows, then what
	// is denied; the rest is the internet.
	// A sandbox with rules of its own reaches them whatever its rules
	// say (its names resolve), unless they deny all, in which case its
	// DNS goes to the DNS filter before it gets here.
	for _, r := range m.Resolvers() {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			to53 := slices.Concat(ipIn(ipDstOffset, netip.PrefixFrom(r, 32)), dport(proto, 53))
			add(fromSandbox, to53, inSet(ipSrcOffset, ruled), verdict(expr.VerdictAccept, ""))
			add(fromSandbox, to53, toEgress)
		}
	}
	// A connection the rules let open goes on when they change (as in
	// e2b): only new ones follow the new rules.
	add(fromSandbox, ctReply(), verdict(expr.VerdictAccept, ""))
	for _, p := range m.allow {
		add(fromSandbox, ipIn(ipDstOffset, p), toUserRules)
	}
	for _, p := range m.deny {
		add(fromSandbox, ipIn(ipDstOffset, p), drop)
	}
	add(fromSandbox, toUserRules)

	// A sandbox with rules of its own goes to its chain (policy.go),
	// every other one to the egress set. One whose chain is not there
	// (sandboxd has restarted and not set its rules again yet) is refused.
	rules := m.rulesMap()
	add(userRules, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipSrcOffset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: rules.Name, SetID: rules.ID, DestRegister: 0, IsDestRegSet: true},
	})
	add(userRules, inSet(ipSrcOffset, ruled), refuse())
	add(userRules, toEgress)

	add(egressOK, inSet(ipSrcOffset, set), verdict(expr.VerdictAccept, ""))
	add(egressOK, refuse())

	// The egress proxy and the DNS filter take what the redirects send
	// them, from sandboxes only.
	for _, l := range m.listeners() {
		add(input, fromSandboxIf, ctDNAT(), dport(l.proto, l.port), verdict(expr.VerdictAccept, ""))
	}
	add(input, fromSandboxIf, ctReply(), verdict(expr.VerdictAccept, ""))
	add(input, fromSandboxIf, drop)
	m.redirects(cc, add)

	add(postrouting, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}, ipIn(ipSrcOffset, m.pool), ipNotIn(ipDstOffset, m.pool), []expr.Any{&expr.Masq{}})
	return nil
}

// replaceTable queues the replacement of table t by an empty one with a
// forward and an input chain (filter), and returns them and a function
// that queues a rule of expressions in a chain of t.
func replaceTable(cc *nftables.Conn, t *nftables.Table) (forward, input *nftables.Chain, add func(*nftables.Chain, ...[]expr.Any)) {
	cc.AddTable(t) // adding first makes the deletion succeed when the table is new
	cc.DelTable(t)
	cc.AddTable(t)
	forward = cc.AddChain(&nftables.Chain{
		Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter,
	})
	input = cc.AddChain(&nftables.Chain{
		Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter,
	})
	add = func(c *nftables.Chain, exprs ...[]expr.Any) {
		cc.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: slices.Concat(exprs...)})
	}
	return forward, input, add
}

// notIPv4 matches a packet that is not IPv4.
func notIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// spoofed matches a packet whose source address is not routed back through
// the interface it came in on: "fib saddr . iif oif missing".
func spoofed() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
}

type listener struct {
	proto byte
	port  uint16
}

// listeners are the host ports the egress proxy and DNS filter take
// redirected connections on.
func (m *Manager) listeners() []listener {
	var out []listener
	if m.proxyPort > 0 {
		out = append(out, listener{unix.IPPROTO_TCP, m.proxyPort})
	}
	if m.dnsPort > 0 {
		out = append(out, listener{unix.IPPROTO_UDP, m.dnsPort}, listener{unix.IPPROTO_TCP, m.dnsPort})
	}
	return out
}

// ifname matches interface names starting with prefix (a comparison
// shorter than the name, as nft's "sk*").
func ifname(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
	}
}

// ctReply matches "ct state established,related".
func ctReply() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  make([]byte, 4),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ipIn matches an IPv4 packet whose address at offset is in p.
func ipIn(offset uint32, p netip.Prefix) []expr.Any { return ipPrefix(offset, p, expr.CmpOpEq) }

// ipNotIn matches an IPv4 packet whose address at offset is not in p.
func ipNotIn(offset uint32, p netip.Prefix) []expr.Any { return ipPrefix(offset, p, expr.CmpOpNeq) }

func ipPrefix(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// refuse rejects a packet with an ICMP network unreachable, which the
// sandbox's connect or send sees at once as ENETUNREACH (as when it had no
// route) rather than waiting out a timeout. Only IPv4 reaches it.
func refuse() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 0 /* ICMP_NET_UNREACH */}}
}

func verdict(kind expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}
}

// dport matches an l4 protocol proto to destination port port.
func dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}
