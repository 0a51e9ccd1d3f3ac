// Package e2e holds what runs the whole Skiff system on one machine: the
// `make up` command (cmd/skiff-up) and, on the same code path, the e2b SDK
// suite (sdk/) that drives an unmodified e2b SDK against it.
package e2e
