package capabilities

import (
	"github.com/opencontainers/runc/libcontainer/configs"
)

// Masks are the bounding, effective, permitted, inheritable and ambient sets
// of c as bit masks, as New and ApplyCaps take them: capabilities unknown to
// this kernel are left out. (Skiff: the init done in C takes masks.)
func Masks(c *configs.Capabilities) ([5]uint64, error) {
	var m [5]uint64
	cm, err := capMap()
	if err != nil {
		return m, err
	}
	for i, names := range [5][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
		for _, name := range names {
			if v, ok := cm[name]; ok && v < 64 {
				m[i] |= 1 << uint(v)
			}
		}
	}
	return m, nil
}
