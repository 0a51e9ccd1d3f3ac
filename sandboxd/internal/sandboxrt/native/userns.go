//go:build cgo

package native

import "C" // userns_owner.c: the owner of each sandbox's user namespace

// hasOwnerHelper reports whether this binary has the C half of
// newUserns (it needs cgo, as libcontainer's nsenter does).
const hasOwnerHelper = true
