package network

// Per-sandbox outbound rules (e2b's allowOut and denyOut, package
// shared/egress). A sandbox whose rules can refuse something has a chain
// of its own, r_<id>: its allowed blocks accepted, its denied blocks
// refused (ICMP network unreachable), the rest accepted; the verdict map "rules" sends its packets
// there by their source address, after the operator's lists (so that no
// rule opens what the operator denies). Its TCP to ports 80 and 443 goes
// to the egress proxy when it allows domain names (the "proxied" set: the
// proxy reads the TLS SNI or HTTP Host and decides), and all its DNS to the
// DNS filter when it denies all (the "dnsfiltered" set: only allowed names
// are resolved, so that a refused name never leaves the host, even as a
// query). A change is one nftables transaction: new connections follow it
// at once, and open connections go on (established traffic is accepted
// before the rules).

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/shared/egress"
)

const (
	rulesMapName    = "rules"
	proxiedSetName  = "proxied"
	dnsFilteredName = "dnsfiltered"
	ruledSetName    = "ruled"
	userRulesChain  = "user_rules"
	sandboxChainPre = "r_"
)

func (m *Manager) rulesMap() *nftables.Set {
	return &nftables.Set{Table: m.table, Name: rulesMapName, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true, ID: 2}
}

func (m *Manager) proxiedSet() *nftables.Set {
	return &nftables.Set{Table: m.table, Name: proxiedSetName, KeyType: nftables.TypeIPAddr, ID: 3}
}

func (m *Manager) dnsFilteredSet() *nftables.Set {
	return &nftables.Set{Table: m.table, Name: dnsFilteredName, KeyType: nftables.TypeIPAddr, ID: 4}
}

func (m *Manager) ruledSet() *nftables.Set {
	return &nftables.Set{Table: m.table, Name: ruledSetName, KeyType: nftables.TypeIPAddr, ID: 5}
}

// keptSets are the sets whose members Init keeps across its rebuild of the
// table: the egress set, and the sandboxes with rules of their own (ruled),
// web traffic proxied and DNS filtered. Until sandboxd has set every
// sandbox's rules again, one with rules reaches nothing but its resolvers
// (or its DNS filter), rather than all the internet.
func (m *Manager) keptSets() []*nftables.Set {
	return []*nftables.Set{m.egressSet(), m.ruledSet(), m.proxiedSet(), m.dnsFilteredSet()}
}

// SetPolicy applies sandbox id's outbound rules: with rules that can
// refuse something, its chain (see the top of this file); otherwise none,
// and internet access (the egress set) as internet says. Rules that allow
// domains need the egress proxy (Options.EgressProxyPort), rules that deny
// all the DNS filter (Options.DNSFilterPort).
func (m *Manager) SetPolicy(id string, b ipam.Block, internet bool, r egress.Rules) error {
	if err := m.check(id, b); err != nil {
		return fmt.Errorf("set rules of sandbox %s: %w", id, err)
	}
	if !r.Restricts() {
		if err := m.clearRules(id, b.Sandbox); err != nil {
			return fmt.Errorf("clear rules of sandbox %s: %w", id, err)
		}
		return m.SetEgress(id, b, internet)
	}
	if r.HasDomains() && m.proxyPort == 0 {
		return fmt.Errorf("sandbox %s: allowing domain names needs the egress proxy, which this sandboxd does not run", id)
	}
	if r.DeniesAll() && m.dnsPort == 0 {
		return fmt.Errorf("sandbox %s: denying all traffic needs the DNS filter, which this sandboxd does not run", id)
	}
	err := m.nftBatch(func(cc *nftables.Conn) error {
		key := b.Sandbox.AsSlice()
		if err := setMember(cc, m.egressSet(), key, false); err != nil {
			return err
		}
		ch := m.sandboxChain(cc, id)
		cc.FlushChain(ch)
		add := func(exprs ...[]expr.Any) {
			cc.AddRule(&nftables.Rule{Table: m.table, Chain: ch, Exprs: slices.Concat(exprs...)})
		}
		for _, p := range r.AllowCIDRs {
			add(ipIn(ipDstOffset, p), verdict(expr.VerdictAccept, ""))
		}
		for _, p := range r.DenyCIDRs {
			add(ipIn(ipDstOffset, p), refuse())
		}
		add(verdict(expr.VerdictAccept, ""))
		elem := []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}
		// Add then delete then add: replaces an element that is there.
		if err := cc.SetAddElements(m.rulesMap(), elem); err != nil {
			return err
		}
		if err := cc.SetDeleteElements(m.rulesMap(), elem); err != nil {
			return err
		}
		if err := cc.SetAddElements(m.rulesMap(), elem); err != nil {
			return err
		}
		if err := setMember(cc, m.ruledSet(), key, true); err != nil {
			return err
		}
		if err := setMember(cc, m.proxiedSet(), key, r.HasDomains()); err != nil {
			return err
		}
		return setMember(cc, m.dnsFilteredSet(), key, r.DeniesAll())
	})
	if err != nil {
		return fmt.Errorf("set rules of sandbox %s: %w", id, err)
	}
	return nil
}

// sandboxChain queues the creation of sandbox id's chain (a no-op when it
// is there) and returns it.
func (m *Manager) sandboxChain(cc *nftables.Conn, id string) *nftables.Chain {
	return cc.AddChain(&nftables.Chain{Name: sandboxChainPre + id, Table: m.table})
}

// setMember adds key to set, or removes it (add then delete, so that a
// missing key is no error).
func setMember(cc *nftables.Conn, set *nftables.Set, key []byte, in bool) error {
	elem := []nftables.SetElement{{Key: key}}
	if err := cc.SetAddElements(set, elem); err != nil {
		return err
	}
	if !in {
		return cc.SetDeleteElements(set, elem)
	}
	return nil
}

// clearRules removes the rules of sandbox id, at address a: its verdict map
// entry, set memberships and chain. Nothing there is no error.
func (m *Manager) clearRules(id string, a netip.Addr) error {
	key := a.AsSlice()
	err := m.nftBatch(func(cc *nftables.Conn) error {
		ch := m.sandboxChain(cc, id)
		elem := []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}
		if err := cc.SetAddElements(m.rulesMap(), elem); err != nil {
			return err
		}
		if err := cc.SetDeleteElements(m.rulesMap(), elem); err != nil {
			return err
		}
		for _, set := range []*nftables.Set{m.ruledSet(), m.proxiedSet(), m.dnsFilteredSet()} {
			if err := setMember(cc, set, key, false); err != nil {
				return err
			}
		}
		cc.FlushChain(ch)
		cc.DelChain(ch)
		return nil
	})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// Permitted reports whether the operator's lists let a sandbox reach addr:
// not in the pool, and allowed (Options.Allow) or not denied (DefaultDeny,
// Options.Deny). The egress proxy checks what it dials with it, since
// redirected connections do not pass the forward rules.
func (m *Manager) Permitted(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.Is4() || m.pool.Contains(addr) {
		return false
	}
	for _, p := range m.allow {
		if p.Contains(addr) {
			return true
		}
	}
	for _, p := range m.deny {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// redirects queues the nat rules that send the proxied sandboxes' web
// traffic to the egress proxy and the DNS-filtered sandboxes' DNS to the
// filter, both listening on the host's loopback (127.0.0.1, which the host
// ends of sandboxes route to: route_localnet, see Setup).
func (m *Manager) redirects(cc *nftables.Conn, add func(*nftables.Chain, ...[]expr.Any)) {
	prerouting := cc.AddChain(&nftables.Chain{
		Name: "prerouting", Table: m.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	from := ifname(expr.MetaKeyIIFNAME, m.prefix)
	if m.proxyPort > 0 {
		for _, port := range []uint16{80, 443} {
			add(prerouting, from, inSet(ipSrcOffset, m.proxiedSet()), dport(unix.IPPROTO_TCP, port), toLoopback(m.proxyPort))
		}
	}
	if m.dnsPort > 0 {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(prerouting, from, inSet(ipSrcOffset, m.dnsFilteredSet()), dport(proto, 53), toLoopback(m.dnsPort))
		}
	}
}

// FilterAddr is where the egress filters listen: the host's loopback.
var FilterAddr = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// inSet matches an IPv4 packet whose address at offset is in set.
func inSet(offset uint32, set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// toLoopback is "dnat ip to 127.0.0.1:port" (FilterAddr).
func toLoopback(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: FilterAddr.AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// ctStatusDNAT is IPS_DST_NAT, conntrack's status bit of a connection whose
// destination was rewritten (by toLoopback).
const ctStatusDNAT = 1 << 5

// ctDNAT matches a packet of a connection whose destination was rewritten
// ("ct status dnat"): the redirected ones.
func ctDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// keptMembers are the members of the pool in set name of the table, if
// there is one (keptSets).
func (m *Manager) keptMembers(cc *nftables.Conn, name string) ([]nftables.SetElement, error) {
	tables, err := cc.ListTablesOfFamily(m.table.Family)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == m.table.Name }) {
		return nil, nil
	}
	sets, err := cc.GetSets(m.table)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == name })
	if i < 0 {
		return nil, nil
	}
	elems, err := cc.GetSetElements(sets[i])
	if err != nil {
		return nil, err
	}
	var keep []nftables.SetElement
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok && a.Is4() && m.pool.Contains(a) {
			keep = append(keep, nftables.SetElement{Key: e.Key})
		}
	}
	return keep, nil
}
