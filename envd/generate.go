// Package envd is the root of the module of envd, the agent inside every
// sandbox, wire-compatible with e2b's envd.
package envd

//go:generate ../bin/buf generate
