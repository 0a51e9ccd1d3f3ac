//go:build !cgo

package native

const hasOwnerHelper = false
