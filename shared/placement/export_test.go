package placement

// InFlight returns how many creates the Placer holds reservations for.
func (p *Placer) InFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, u := range p.inflight {
		n += int(u.sandboxes)
	}
	return n
}

// Held returns how many placed sandboxes the Placer counts against their
// nodes because their inventories do not count them yet.
func (p *Placer) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, h := range p.held {
		n += len(h.placed)
	}
	return n
}
