//go:build tools

// Package runsc pins the gVisor runsc that hack/runsc/build.sh builds.
package runsc

import _ "gvisor.dev/gvisor/runsc"
