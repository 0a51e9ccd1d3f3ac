//go:build cgo && seccomp

package native

// seccompBuilt reports whether libcontainer's seccomp support (libseccomp,
// through cgo and the seccomp build tag) is compiled in.
const seccompBuilt = true
