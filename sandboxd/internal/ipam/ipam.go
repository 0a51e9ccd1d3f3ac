// Package ipam hands out the sandboxes' network addresses from a host-local
// pool (sandboxd's --sandbox-cidr). Each sandbox gets a /30 of it: the
// network address, the host end of its veth pair, the sandbox's own address,
// and the broadcast address. Blocks are handed out round-robin, so a freed
// block is the last to be reused (stale connection-tracking entries of a
// killed sandbox then expire before its address comes back).
package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// blockBits is the prefix length of one sandbox's block.
const blockBits = 30

var (
	// ErrExhausted is returned when every block of the pool is in use.
	ErrExhausted = errors.New("address pool exhausted")
	// ErrInUse is returned when Claim names a block another owner holds.
	ErrInUse = errors.New("address block in use")
)

// Block is one sandbox's addresses.
type Block struct {
	Prefix  netip.Prefix // the /30
	Host    netip.Addr   // the host end of the veth pair, the sandbox's gateway
	Sandbox netip.Addr   // the sandbox's address
}

// Pool is an IPv4 pool of /30 blocks. It is safe for concurrent use.
type Pool struct {
	prefix netip.Prefix
	blocks int

	mu     sync.Mutex
	owners map[int]string // block index → owner
	byID   map[string]int // owner → block index
	next   int
}

// New returns a pool over cidr, an IPv4 prefix of /29 or wider (at least
// two blocks).
func New(cidr string) (*Pool, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("sandbox address pool %q: %w", cidr, err)
	}
	if !p.Addr().Is4() {
		return nil, fmt.Errorf("sandbox address pool %q: must be IPv4", cidr)
	}
	if p.Bits() > blockBits-1 || p.Bits() < 8 {
		return nil, fmt.Errorf("sandbox address pool %q: prefix must be between /8 and /%d", cidr, blockBits-1)
	}
	return &Pool{
		prefix: p.Masked(), blocks: 1 << (blockBits - p.Bits()),
		owners: map[int]string{}, byID: map[string]int{},
	}, nil
}

// Size is how many sandboxes the pool can address.
func (p *Pool) Size() int { return p.blocks }

// Allocate gives owner a block, or the one it already holds.
func (p *Pool) Allocate(owner string) (Block, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, ok := p.byID[owner]; ok {
		return p.block(i), nil
	}
	for n := range p.blocks {
		i := (p.next + n) % p.blocks
		if _, used := p.owners[i]; !used {
			p.owners[i], p.byID[owner] = owner, i
			p.next = (i + 1) % p.blocks
			return p.block(i), nil
		}
	}
	return Block{}, fmt.Errorf("%w: all %d blocks of %s are in use", ErrExhausted, p.blocks, p.prefix)
}

// Claim records that owner holds the block containing addr, as a restarted
// sandboxd re-adopts a sandbox.
func (p *Pool) Claim(owner string, addr netip.Addr) (Block, error) {
	if !p.prefix.Contains(addr) {
		return Block{}, fmt.Errorf("address %s is outside the pool %s", addr, p.prefix)
	}
	i := p.index(addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.owners[i]; ok && cur != owner {
		return Block{}, fmt.Errorf("%w: %s holds %s", ErrInUse, cur, p.block(i).Prefix)
	}
	if old, ok := p.byID[owner]; ok && old != i {
		delete(p.owners, old)
	}
	p.owners[i], p.byID[owner] = owner, i
	return p.block(i), nil
}

// Release frees owner's block; it does nothing for an owner without one.
func (p *Pool) Release(owner string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, ok := p.byID[owner]; ok {
		delete(p.owners, i)
		delete(p.byID, owner)
	}
}

func (p *Pool) block(i int) Block {
	base := p.prefix.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(i) << (32 - blockBits)
	addr := func(off uint32) netip.Addr {
		x := v + off
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	return Block{Prefix: netip.PrefixFrom(addr(0), blockBits), Host: addr(1), Sandbox: addr(2)}
}

func (p *Pool) index(a netip.Addr) int {
	b, base := a.As4(), p.prefix.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	w := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	return int((v - w) >> (32 - blockBits))
}
