package native

// InitInC reports whether sandbox id's init, started by r, was done in C.
func (r *Runtime) InitInC(id string) bool {
	r.mu.Lock()
	c := r.live[id]
	r.mu.Unlock()
	return c != nil && c.InitInC()
}
