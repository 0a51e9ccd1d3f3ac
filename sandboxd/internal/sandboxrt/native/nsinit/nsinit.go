// Package nsinit makes a binary that imports it able to become a native
// sandbox's init: libcontainer starts every sandbox by executing the binary
// that asked for it as "<binary> init", and that process must become the
// sandbox and nothing else.
//
// It does so from this package's init, not from package main's: Go runs a
// package's init as soon as everything it imports is initialised, in order
// of import path, and this package imports nothing but libcontainer. So the
// init does not first run the package initialisation of the rest of
// sandboxd (protobuf descriptors, Prometheus, gRPC of the OTLP exporter,
// regular expressions), which it never uses; that was about a fifth of the
// init's CPU on every sandbox start.
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
