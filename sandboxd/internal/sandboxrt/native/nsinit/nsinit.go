// Package nsinit makes a binary that imports it able to become a native
// sandbox's init: libcontainer starts every sandbox by executing a binary
// as "<binary> init", and that process must become the sandbox and nothing
// else. sandboxd runs sandboxd-init (cmd/sandboxd-init), a small binary of
// little more than this package, or without one a copy of its own.
//
// It does so from this package's init, not from package main's, so that at
// least the packages Go would initialise after this one are never
// initialised in an init. (Go initialises packages in order of import path
// among those whose imports are done, which in sandboxd's binary still puts
// most of its packages first; hence sandboxd-init.)
package nsinit

import (
	"os"

	"github.com/opencontainers/runc/libcontainer"

	// The C half of "init", run before Go starts: it enters the sandbox's
	// namespaces.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}

// Build names the build of libcontainer this binary holds (our fork's
// name: hack/runc-fork), for sandboxd to check that its init binary holds
// the same: libcontainer's parent and init speak a protocol of their own
// build.
func Build() string { return libcontainer.Fork }
