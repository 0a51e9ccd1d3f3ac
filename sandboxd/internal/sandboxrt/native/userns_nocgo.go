//go:build !cgo

package native

import (
	"errors"
	"os"
)

// newUserns: see userns.go; it needs cgo (userns_owner.c), as
// libcontainer's nsenter does.
func newUserns(uint32) (*os.File, error) {
	return nil, errors.New("user namespace for a sandbox: sandboxd was built without cgo")
}
