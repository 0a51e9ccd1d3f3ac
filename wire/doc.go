// Package wire holds what Skiff's processes and e2b's SDKs say to each other
// that more than one module must spell the same way: header names, e2b's
// error body, and envd's POST /init body.
//
// It is its own module, on the standard library alone, so that every other
// module may import it, envd (which runs inside every sandbox and depends on
// no other Skiff module but this one) included.
package wire
