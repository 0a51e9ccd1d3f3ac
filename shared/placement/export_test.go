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
