//go:build !(cgo && seccomp)

package native

const seccompBuilt = false
