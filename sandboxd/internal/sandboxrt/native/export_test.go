package native

import "os"

// InitInC reports whether sandbox id's init, started by r, was done in C.
func (r *Runtime) InitInC(id string) bool {
	r.mu.Lock()
	c := r.live[id]
	r.mu.Unlock()
	return c != nil && c.InitInC()
}

// BaseMountinfo is the mountinfo of r's base mount namespace, or "" when
// it has none.
func (r *Runtime) BaseMountinfo() (string, error) {
	if r.baseNS == nil {
		return "", nil
	}
	return onThrowawayThread(func() (string, error) {
		if err := enterMountNS(r.baseNS); err != nil {
			return "", err
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		return string(b), err
	})
}
